/* A native program that spins in a library it links (libspin.so): for the deleted-binary
 * and stripped-library profile tests.  spinner SECONDS */
#include <stdlib.h>
#include <time.h>

unsigned long spin_exported(unsigned long n);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double end = now() + (argc > 1 ? atof(argv[1]) : 5.0);
    unsigned long acc = 0;
    while (now() < end)
        acc += spin_exported(200000);
    return acc == 1;  /* never: keeps the loop from being optimised away */
}
