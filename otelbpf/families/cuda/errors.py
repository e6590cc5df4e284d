"""Names of CUDA error codes, so spans and metrics say what a number means.

Values from the CUDA 12 headers (driver_types.h ``cudaError`` and cuda.h
``CUresult``); codes not listed are reported by number.
"""

RUNTIME = {
    0: "cudaSuccess",
    1: "cudaErrorInvalidValue",
    2: "cudaErrorMemoryAllocation",
    3: "cudaErrorInitializationError",
    4: "cudaErrorCudartUnloading",
    9: "cudaErrorInvalidConfiguration",
    11: "cudaErrorInvalidPitchValue",
    17: "cudaErrorInvalidDevicePointer",
    21: "cudaErrorInvalidMemcpyDirection",
    34: "cudaErrorStubLibrary",
    35: "cudaErrorInsufficientDriver",
    36: "cudaErrorCallRequiresNewerDriver",
    98: "cudaErrorInvalidDeviceFunction",
    100: "cudaErrorNoDevice",
    101: "cudaErrorInvalidDevice",
    200: "cudaErrorInvalidKernelImage",
    201: "cudaErrorDeviceUninitialized",
    209: "cudaErrorNoKernelImageForDevice",
    400: "cudaErrorInvalidResourceHandle",
    500: "cudaErrorSymbolNotFound",
    600: "cudaErrorNotReady",
    700: "cudaErrorIllegalAddress",
    701: "cudaErrorLaunchOutOfResources",
    702: "cudaErrorLaunchTimeout",
    719: "cudaErrorLaunchFailure",
    999: "cudaErrorUnknown",
}

DRIVER = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    200: "CUDA_ERROR_INVALID_IMAGE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    400: "CUDA_ERROR_INVALID_HANDLE",
    500: "CUDA_ERROR_NOT_FOUND",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    999: "CUDA_ERROR_UNKNOWN",
}


def error_name(function: str, code: int) -> str:
    table = DRIVER if function.startswith("cu") and not function.startswith("cuda") else RUNTIME
    return table.get(code, f"error {code}")
