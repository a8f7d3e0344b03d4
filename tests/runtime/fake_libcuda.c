/* A stand-in for libcuda.so.1 that records what it is asked to do.

   Why: the launch path (parameter pointers, launch configs and their attributes, function
   attributes, context handling, tensor-map arguments) goes through cuda.bindings into the
   driver, and most of that can be checked, and timed, without a GPU if the "driver" only
   records its arguments. test_launch_fake_driver.py builds this file with the C compiler and
   runs pyfuser's runtime against it in a subprocess whose LD_LIBRARY_PATH points here.

   Only the calls pyfuser makes are implemented; cuGetProcAddress reports every other symbol
   as not found. The record is read back through ctypes (struct fake_record). */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
};

/* Driver struct layouts (CUDA 12/13 ABI) for the launch configuration. */
typedef struct {
    int id;
    int pad_;
    union {
        char bytes[64];
        struct { unsigned x, y, z; } dim;
        int value;
    } value;
} fake_launch_attribute;

typedef struct {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_mem;
    CUstream stream;
    fake_launch_attribute *attrs;
    unsigned num_attrs;
} fake_launch_config;

#define MAX_PARAMS 32
#define MAX_ATTRS 8

struct fake_record {
    long launches;
    int via_ex;             /* 1: cuLaunchKernelEx, 0: cuLaunchKernel */
    int via_extra;          /* 1: parameters came in `extra` */
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_mem;
    uint64_t stream;
    uint64_t function;
    uint64_t current_context;
    unsigned num_attrs;
    int attr_ids[MAX_ATTRS];
    unsigned attr_values[MAX_ATTRS][3];
    int func_attr_values[32]; /* last value set per CUfunction_attribute, -1 = never */
    int func_attr_sets;       /* number of cuFuncSetAttribute calls */
    int modules_loaded;
    char function_name[256];
    unsigned char params[4096];
    uint64_t tensor_map_args[16];
    int occupancy_block;
    uint64_t occupancy_smem;
    int param_info_errors;    /* cuFuncGetParamInfo calls past the last parameter */
};

static struct fake_record record;
static size_t param_offsets[MAX_PARAMS], param_sizes[MAX_PARAMS];
static int param_count;
static int fail_next_launch;
static char contexts[4];
static char module_storage, function_storage;
static __thread CUcontext current;
static __thread CUcontext stack[16];
static __thread int depth;

EXPORT struct fake_record *fake_record(void) { return &record; }

EXPORT void fake_reset(void) {
    memset(&record, 0, sizeof record);
    memset(record.func_attr_values, 0xff, sizeof record.func_attr_values);
    fail_next_launch = 0;
}

__attribute__((constructor)) static void fake_init(void) { fake_reset(); }

EXPORT void fake_set_params(int n, const size_t *offsets, const size_t *sizes) {
    param_count = n;
    for (int i = 0; i < n; ++i) {
        param_offsets[i] = offsets[i];
        param_sizes[i] = sizes[i];
    }
}

EXPORT void fake_fail_next_launch(int code) { fail_next_launch = code; }
EXPORT void fake_clear_current(void) { current = NULL; depth = 0; }

/* ---- initialisation and devices ---- */

EXPORT CUresult cuInit(unsigned flags) { (void)flags; return CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal < 0 || ordinal >= 4) return CUDA_ERROR_INVALID_VALUE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d) {
    (void)d;
    switch (attribute) {
    case 1: *v = 1024; break;       /* max threads per block */
    case 10: *v = 32; break;        /* warp size */
    case 12: *v = 65536; break;     /* max registers per block */
    case 16: *v = 132; break;       /* multiprocessor count */
    case 36: *v = 2619000; break;   /* memory clock, kHz */
    case 37: *v = 5120; break;      /* bus width, bits */
    case 38: *v = 52428800; break;  /* L2 bytes */
    case 39: *v = 2048; break;      /* max threads per SM */
    case 75: *v = 9; break;
    case 76: *v = 0; break;
    case 81: *v = 233472; break;    /* smem per SM */
    case 82: *v = 65536; break;     /* registers per SM */
    case 97: *v = 232448; break;    /* smem per block opt-in */
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorName(CUresult e, const char **name) {
    switch (e) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *name = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"; break;
    default: *name = "CUDA_ERROR_UNKNOWN";
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **text) { return cuGetErrorName(e, text); }

/* ---- contexts ---- */

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    *c = &contexts[d];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { (void)d; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { current = c; return CUDA_SUCCESS; }

EXPORT CUresult cuCtxPushCurrent(CUcontext c) {
    stack[depth++] = current;
    current = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent(CUcontext *c) {
    if (depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (c) *c = current;
    current = stack[--depth];
    return CUDA_SUCCESS;
}

/* ---- modules and functions ---- */

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    if (memcmp(image, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
    record.modules_loaded++;
    *m = &module_storage;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleUnload(CUmodule m) { (void)m; return CUDA_SUCCESS; }

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    (void)m;
    snprintf(record.function_name, sizeof record.function_name, "%s", name);
    *f = &function_storage;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetAttribute(CUfunction f, int attribute, int value) {
    (void)f;
    if (attribute < 0 || attribute >= 32) return CUDA_ERROR_INVALID_VALUE;
    record.func_attr_values[attribute] = value;
    record.func_attr_sets++;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncGetAttribute(int *v, int attribute, CUfunction f) {
    (void)f;
    *v = (attribute >= 0 && attribute < 32) ? record.func_attr_values[attribute] : 0;
    if (attribute == 8 && *v < 0) *v = 48 * 1024; /* the driver's default dynamic smem limit */
    if (*v < 0) *v = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncGetParamInfo(CUfunction f, size_t index, size_t *offset, size_t *size) {
    (void)f;
    if ((int)index >= param_count) {
        record.param_info_errors++;   /* a driver error compute-sanitizer reports */
        return CUDA_ERROR_INVALID_VALUE;
    }
    *offset = param_offsets[index];
    *size = param_sizes[index];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncGetParamCount(CUfunction f, size_t *count) {
    (void)f;
    *count = (size_t)param_count;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block,
                                                           size_t smem) {
    (void)f;
    record.occupancy_block = block;
    record.occupancy_smem = smem;
    *n = block > 0 ? 2048 / block : 0;
    return CUDA_SUCCESS;
}

/* Clusters that fit at once: fake_set_max_clusters sets the answer. The config is recorded
   in the launch fields (grid, block, shared memory, attributes), without counting a launch. */
static int max_clusters = 5;
EXPORT void fake_set_max_clusters(int n) { max_clusters = n; }

EXPORT CUresult cuOccupancyMaxActiveClusters(int *n, CUfunction f,
                                             const fake_launch_config *config) {
    record.function = (uint64_t)(uintptr_t)f;
    memcpy(record.grid, config->grid, sizeof record.grid);
    memcpy(record.block, config->block, sizeof record.block);
    record.shared_mem = config->shared_mem;
    record.num_attrs = config->num_attrs;
    int has_cluster = 0;
    for (unsigned i = 0; i < config->num_attrs && i < MAX_ATTRS; ++i) {
        record.attr_ids[i] = config->attrs[i].id;
        record.attr_values[i][0] = config->attrs[i].value.dim.x;
        record.attr_values[i][1] = config->attrs[i].value.dim.y;
        record.attr_values[i][2] = config->attrs[i].value.dim.z;
        has_cluster |= config->attrs[i].id == 4; /* CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION */
    }
    if (!has_cluster) return CUDA_ERROR_INVALID_VALUE; /* the driver needs a cluster size */
    *n = max_clusters;
    return CUDA_SUCCESS;
}

/* ---- launches ---- */

static void copy_params(void **kernel_params, void **extra) {
    record.via_extra = kernel_params == NULL && extra != NULL;
    if (kernel_params) {
        for (int i = 0; i < param_count; ++i)
            memcpy(record.params + param_offsets[i], kernel_params[i], param_sizes[i]);
        return;
    }
    void *buffer = NULL;
    size_t size = 0;
    for (int i = 0; extra && extra[i] != NULL; i += 2) {
        if ((uintptr_t)extra[i] == 1) buffer = extra[i + 1];
        if ((uintptr_t)extra[i] == 2) size = *(size_t *)extra[i + 1];
    }
    if (buffer && size <= sizeof record.params) memcpy(record.params, buffer, size);
}

static CUresult finish_launch(void) {
    record.launches++;
    record.current_context = (uint64_t)(uintptr_t)current;
    int code = fail_next_launch;
    fail_next_launch = 0;
    return code;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned smem, CUstream stream,
                               void **kernel_params, void **extra) {
    record.via_ex = 0;
    record.function = (uint64_t)(uintptr_t)f;
    record.grid[0] = gx; record.grid[1] = gy; record.grid[2] = gz;
    record.block[0] = bx; record.block[1] = by; record.block[2] = bz;
    record.shared_mem = smem;
    record.stream = (uint64_t)(uintptr_t)stream;
    record.num_attrs = 0;
    copy_params(kernel_params, extra);
    return finish_launch();
}

EXPORT CUresult cuLaunchKernelEx(const fake_launch_config *config, CUfunction f,
                                 void **kernel_params, void **extra) {
    record.via_ex = 1;
    record.function = (uint64_t)(uintptr_t)f;
    memcpy(record.grid, config->grid, sizeof record.grid);
    memcpy(record.block, config->block, sizeof record.block);
    record.shared_mem = config->shared_mem;
    record.stream = (uint64_t)(uintptr_t)config->stream;
    record.num_attrs = config->num_attrs;
    for (unsigned i = 0; i < config->num_attrs && i < MAX_ATTRS; ++i) {
        record.attr_ids[i] = config->attrs[i].id;
        record.attr_values[i][0] = config->attrs[i].value.dim.x;
        record.attr_values[i][1] = config->attrs[i].value.dim.y;
        record.attr_values[i][2] = config->attrs[i].value.dim.z;
    }
    copy_params(kernel_params, extra);
    return finish_launch();
}

/* ---- tensor maps: the arguments are written into the map so the test can read them ---- */

EXPORT CUresult cuTensorMapEncodeTiled(uint64_t *map, int dtype, unsigned rank, void *address,
                                       const uint64_t *dims, const uint64_t *strides,
                                       const unsigned *box, const unsigned *element_strides,
                                       int interleave, int swizzle, int l2, int oob) {
    if (((uintptr_t)map) % 64) return CUDA_ERROR_INVALID_VALUE;
    if (rank < 1 || rank > 5) return CUDA_ERROR_INVALID_VALUE;
    memset(map, 0, 128);
    map[0] = (uint64_t)dtype;
    map[1] = rank;
    map[2] = (uint64_t)(uintptr_t)address;
    for (unsigned i = 0; i < rank; ++i) {
        map[3 + i] = dims[i];
        ((uint16_t *)&map[13])[i] = (uint16_t)box[i];
        ((uint8_t *)&map[14])[i] = (uint8_t)element_strides[i];
    }
    for (unsigned i = 0; i + 1 < rank; ++i) map[8 + i] = strides[i];
    map[15] = (uint64_t)interleave | ((uint64_t)swizzle << 8) | ((uint64_t)l2 << 16) |
              ((uint64_t)oob << 24);
    memcpy(record.tensor_map_args, map, 128);
    return CUDA_SUCCESS;
}

/* NVRTC looks for the driver while compiling; "not found" makes it carry on without it. */
EXPORT CUresult cuGetExportTable(const void **table, const void *id) {
    (void)id;
    *table = NULL;
    return CUDA_ERROR_NOT_FOUND;
}

/* ---- symbol lookup: cuda.bindings resolves every entry point through this ---- */

struct entry { const char *name; void *fn; };
static const struct entry table[] = {
    {"cuInit", (void *)cuInit},
    {"cuDriverGetVersion", (void *)cuDriverGetVersion},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount},
    {"cuDeviceGet", (void *)cuDeviceGet},
    {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
    {"cuGetErrorName", (void *)cuGetErrorName},
    {"cuGetErrorString", (void *)cuGetErrorString},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", (void *)cuDevicePrimaryCtxRelease},
    {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
    {"cuCtxPushCurrent", (void *)cuCtxPushCurrent},
    {"cuCtxPopCurrent", (void *)cuCtxPopCurrent},
    {"cuModuleLoadData", (void *)cuModuleLoadData},
    {"cuModuleUnload", (void *)cuModuleUnload},
    {"cuModuleGetFunction", (void *)cuModuleGetFunction},
    {"cuFuncSetAttribute", (void *)cuFuncSetAttribute},
    {"cuFuncGetAttribute", (void *)cuFuncGetAttribute},
    {"cuFuncGetParamInfo", (void *)cuFuncGetParamInfo},
    {"cuFuncGetParamCount", (void *)cuFuncGetParamCount},
    {"cuOccupancyMaxActiveBlocksPerMultiprocessor",
     (void *)cuOccupancyMaxActiveBlocksPerMultiprocessor},
    {"cuOccupancyMaxActiveClusters", (void *)cuOccupancyMaxActiveClusters},
    {"cuLaunchKernel", (void *)cuLaunchKernel},
    {"cuLaunchKernelEx", (void *)cuLaunchKernelEx},
    {"cuTensorMapEncodeTiled", (void *)cuTensorMapEncodeTiled},
    {"cuGetProcAddress", NULL}, /* filled in below: the table cannot name a later function */
};

static int trace_enabled(void) {
    const char *v = getenv("FAKE_LIBCUDA_TRACE");
    return v && *v == '1';
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int version, uint64_t flags,
                                    int *status) {
    (void)version; (void)flags;
    if (strcmp(symbol, "cuGetProcAddress") == 0) {
        *fn = (void *)cuGetProcAddress_v2;
        if (status) *status = 0;
        return CUDA_SUCCESS;
    }
    for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i) {
        if (table[i].fn && strcmp(table[i].name, symbol) == 0) {
            *fn = table[i].fn;
            if (status) *status = 0;
            return CUDA_SUCCESS;
        }
    }
    if (trace_enabled()) fprintf(stderr, "fake libcuda: no %s\n", symbol);
    *fn = NULL;
    if (status) *status = 1;
    return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **fn, int version, uint64_t flags) {
    return cuGetProcAddress_v2(symbol, fn, version, flags, NULL);
}
