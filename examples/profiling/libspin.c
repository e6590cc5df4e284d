/* spin_exported (in .dynsym) calls spin_static (in .symtab only, gone when stripped). */
__attribute__((noinline)) static unsigned long spin_static(unsigned long n)
{
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++)
        acc += i ^ (i >> 3);
    return acc;
}

__attribute__((noinline)) unsigned long spin_exported(unsigned long n)
{
    return spin_static(n) + 1;
}
