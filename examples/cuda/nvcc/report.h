// Shared by the nvcc example programs: waiting before the first launch, and the JSON report of
// return codes plus the stand-in driver's call counts (null on a real or missing driver).
#pragma once
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>

static inline void wait_before_launching(long sleep_ms, const char *wait_for)
{
    if (sleep_ms > 0)
        usleep(sleep_ms * 1000);
    if (wait_for) {
        fprintf(stderr, "pid %d waiting for %s\n", getpid(), wait_for);
        struct stat st;
        while (stat(wait_for, &st) != 0)
            usleep(1000);
    }
}

struct Report {
    std::map<std::string, std::map<int, long>> codes; // call -> return code -> count

    void rc(const char *call, int code) { codes[call][code]++; }

    // "return_codes": {...}, "driver_calls": {...} or null
    void print() const
    {
        printf("\"return_codes\": {");
        const char *sep = "";
        for (auto &[call, by_code] : codes) {
            printf("%s\"%s\": {", sep, call.c_str());
            const char *s2 = "";
            for (auto &[code, n] : by_code) {
                printf("%s\"%d\": %ld", s2, code, n);
                s2 = ", ";
            }
            printf("}");
            sep = ", ";
        }
        printf("}, \"driver_calls\": ");
        void *d = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        using Counts = size_t (*)(const char **, unsigned long long *, size_t);
        auto counts = d ? reinterpret_cast<Counts>(dlsym(d, "fakecuda_calls")) : nullptr;
        if (!counts) {
            printf("null");
            return;
        }
        const char *names[256];
        unsigned long long n[256];
        size_t total = counts(names, n, 256);
        printf("{");
        sep = "";
        for (size_t i = 0; i < total && i < 256; i++)
            if (n[i]) {
                printf("%s\"%s\": %llu", sep, names[i], n[i]);
                sep = ", ";
            }
        printf("}");
    }
};
