/*
 * A stand-in for the NVIDIA driver's NVML (libnvidia-ml.so.1), for the gpu receiver's tests on
 * hosts without a GPU. It implements exactly the entry points the receiver calls through
 * nvidia-ml-py (pynvml), under the names pynvml looks up (nvmlInitWithFlags,
 * nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetPciInfo_v3,
 * nvmlDeviceGetComputeRunningProcesses_v3, nvmlEventSetWait_v2, ...), with the signatures and
 * struct layouts of NVIDIA's nvml.h. pynvml finds it by LD_LIBRARY_PATH
 * (build/examples/fakenvml/, built by examples/build.sh).
 *
 * The script, with t the milliseconds since nvmlInitWithFlags:
 *   GPU 0  "NVIDIA H100 80GB HBM3", GPU-00000000-0000-4000-8000-000000000000, 00000000:3B:00.0
 *          utilization ramps 0, 10, ... 100 % (+10 every step_ms, 200 by default); memory
 *          controller half of it; 80 GiB, 3 GiB used (by the one process); 300 W, energy
 *          300 mJ per ms; SM 1980 MHz, memory 2619 MHz; 40 C + utilization / 10; PCIe TX
 *          1000 KB/s, RX 2000 KB/s; NVLink data TX t KiB, RX 2t KiB (all links).
 *          One process (FAKENVML="pid=N"): 3 GiB, a utilization sample per read (SM = the
 *          device's, memory = half).
 *   GPU 1  "NVIDIA H100 80GB HBM3", GPU-11111111-1111-4111-8111-111111111111, 00000000:86:00.0
 *          idle (0 %), nothing used; power NVML_ERROR_NOT_SUPPORTED, no NVLink (each field
 *          NOT_SUPPORTED); energy 70 mJ per ms; 35 C; one XID 79 event from t = 300 ms; with
 *          FAKENVML="lost_ms=M" every call on it fails with NVML_ERROR_GPU_IS_LOST from t = M.
 * FAKENVML is a comma-separated list of key=value (pid, lost_ms, step_ms); all optional.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
} nvmlReturn_t;

#define NVML_CLOCK_SM 1
#define NVML_CLOCK_MEM 2
#define NVML_TEMPERATURE_GPU 0
#define NVML_PCIE_UTIL_TX_BYTES 0
#define NVML_PCIE_UTIL_RX_BYTES 1
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX 139
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3
#define nvmlEventTypeXidCriticalError 0x8ULL

/* nvml.h layouts (pynvml declares the same) */
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

struct fake_device {
    unsigned int index;
    const char *name, *uuid, *bus_id;
    unsigned int bus;
};
typedef struct fake_device *nvmlDevice_t;

struct fake_event_set {
    int xid_registered; /* on GPU 1 */
    int xid_delivered;
};
typedef struct fake_event_set *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static struct fake_device devices[2] = {
    {0, "NVIDIA H100 80GB HBM3", "GPU-00000000-0000-4000-8000-000000000000", "00000000:3B:00.0", 0x3b},
    {1, "NVIDIA H100 80GB HBM3", "GPU-11111111-1111-4111-8111-111111111111", "00000000:86:00.0", 0x86},
};

#define GIB (1024ULL * 1024 * 1024)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static struct timespec started;
static unsigned int script_pid;
static long long lost_ms = -1;
static long long step_ms = 200;

static long long elapsed_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - started.tv_sec) * 1000LL + (now.tv_nsec - started.tv_nsec) / 1000000;
}

static unsigned long long wall_us(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return now.tv_sec * 1000000ULL + now.tv_nsec / 1000;
}

static unsigned int gpu0_utilization(void)
{
    long long step = elapsed_ms() / step_ms;
    return step >= 10 ? 100 : (unsigned int)(step * 10);
}

static void read_script(void)
{
    const char *s = getenv("FAKENVML");
    while (s && *s) {
        if (strncmp(s, "pid=", 4) == 0)
            script_pid = (unsigned int)strtoul(s + 4, NULL, 10);
        else if (strncmp(s, "lost_ms=", 8) == 0)
            lost_ms = strtoll(s + 8, NULL, 10);
        else if (strncmp(s, "step_ms=", 8) == 0 && strtoll(s + 8, NULL, 10) > 0)
            step_ms = strtoll(s + 8, NULL, 10);
        s = strchr(s, ',');
        if (s)
            s++;
    }
}

/* Every device call starts here: a valid handle of an initialized library, GPU 1 maybe lost. */
static nvmlReturn_t check(nvmlDevice_t d)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (d != &devices[0] && d != &devices[1])
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->index == 1 && lost_ms >= 0 && elapsed_ms() >= lost_ms)
        return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define CHECK(d)                                                                                   \
    do {                                                                                           \
        nvmlReturn_t r_ = check(d);                                                                \
        if (r_ != NVML_SUCCESS)                                                                    \
            return r_;                                                                             \
    } while (0)

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&lock);
    if (!initialized++) {
        clock_gettime(CLOCK_MONOTONIC, &started);
        read_script();
    }
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&lock);
    if (initialized)
        initialized--;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (length < 16)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(version, length, "%s", "580.65.06-fake");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    *count = 2;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (index > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length)
{
    CHECK(d);
    snprintf(name, length, "%s", d->name);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length)
{
    CHECK(d);
    snprintf(uuid, length, "%s", d->uuid);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    CHECK(d);
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%s", d->bus_id + 4);
    snprintf(pci->busId, sizeof(pci->busId), "%s", d->bus_id);
    pci->bus = d->bus;
    pci->pciDeviceId = 0x233010de;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    CHECK(d);
    u->gpu = d->index == 0 ? gpu0_utilization() : 0;
    u->memory = u->gpu / 2;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    CHECK(d);
    m->total = 80 * GIB;
    m->used = d->index == 0 ? 3 * GIB : 0;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *milliwatts)
{
    CHECK(d);
    if (d->index == 1)
        return NVML_ERROR_NOT_SUPPORTED;
    *milliwatts = 300000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *millijoules)
{
    CHECK(d);
    *millijoules = (unsigned long long)elapsed_ms() * (d->index == 0 ? 300 : 70);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, unsigned int type, unsigned int *mhz)
{
    CHECK(d);
    if (type == NVML_CLOCK_SM)
        *mhz = 1980;
    else if (type == NVML_CLOCK_MEM)
        *mhz = 2619;
    else
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, unsigned int sensor, unsigned int *celsius)
{
    CHECK(d);
    if (sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *celsius = d->index == 0 ? 40 + gpu0_utilization() / 10 : 35;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, unsigned int counter, unsigned int *kb_per_s)
{
    CHECK(d);
    if (counter == NVML_PCIE_UTIL_TX_BYTES)
        *kb_per_s = d->index == 0 ? 1000 : 0;
    else if (counter == NVML_PCIE_UTIL_RX_BYTES)
        *kb_per_s = d->index == 0 ? 2000 : 0;
    else
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values)
{
    CHECK(d);
    long long t = elapsed_ms();
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)wall_us();
        v->latencyUsec = 0;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        if (d->index == 1) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        } else if (v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX && v->scopeId == 0xFFFFFFFFu) {
            v->nvmlReturn = NVML_SUCCESS;
            v->value.ullVal = (unsigned long long)t;
        } else if (v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX && v->scopeId == 0xFFFFFFFFu) {
            v->nvmlReturn = NVML_SUCCESS;
            v->value.ullVal = 2ULL * (unsigned long long)t;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos)
{
    CHECK(d);
    unsigned int n = d->index == 0 && script_pid ? 1 : 0;
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    if (n) {
        infos[0].pid = script_pid;
        infos[0].usedGpuMemory = 3 * GIB;
        infos[0].gpuInstanceId = infos[0].computeInstanceId = 0xFFFFFFFFu;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count, unsigned long long last_seen_us)
{
    CHECK(d);
    if (d->index != 0 || !script_pid)
        return NVML_ERROR_NOT_FOUND;
    unsigned long long now = wall_us();
    if (now <= last_seen_us)
        return NVML_ERROR_NOT_FOUND;
    if (samples == NULL || *count < 1) {
        *count = 1;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = 1;
    samples[0].pid = script_pid;
    samples[0].timeStamp = now;
    samples[0].smUtil = gpu0_utilization();
    samples[0].memUtil = samples[0].smUtil / 2;
    samples[0].encUtil = samples[0].decUtil = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    *set = calloc(1, sizeof(**set));
    return *set ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set)
{
    CHECK(d);
    if (d->index == 1 && (types & nvmlEventTypeXidCriticalError))
        set->xid_registered = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (set->xid_registered && !set->xid_delivered && elapsed_ms() >= 300) {
        set->xid_delivered = 1;
        memset(data, 0, sizeof(*data));
        data->device = &devices[1];
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = 79;
        return NVML_SUCCESS;
    }
    if (timeout_ms)
        usleep(timeout_ms * 1000U);
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    free(set);
    return NVML_SUCCESS;
}
