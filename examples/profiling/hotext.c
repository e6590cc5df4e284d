/* A C extension with a hot native function, for the merged-stack test:
 * python native_hot.py calls hotext.crunch() from a Python function, and the
 * profile must show crunch -> crunch_inner below that Python frame.
 * Built with frame pointers (examples/build.sh) so its frames chain. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

__attribute__((noinline)) static unsigned long crunch_inner(unsigned long n)
{
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++)
        acc += i * i;
    return acc;
}

__attribute__((noinline)) static PyObject *crunch(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long n = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred())
        return NULL;
    unsigned long r = crunch_inner(n);
    return PyLong_FromUnsignedLong(r);
}

static PyMethodDef methods[] = {
    {"crunch", crunch, METH_O, "Spin in C for n iterations."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "hotext", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit_hotext(void)
{
    return PyModule_Create(&module);
}
