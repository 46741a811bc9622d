// How long an importer's cuIpcOpenMemHandle / cuIpcCloseMemHandle of one cuMemAlloc allocation takes, by its size:
// no gpu-ipc code, the bare driver. Two roles, one process each (a handle cannot be opened by its exporter):
//   legacy-open export BYTES HANDLE_FILE   allocates BYTES exactly (cuMemAlloc, filled with 0x5a), writes the
//                                          64-byte handle and its size to HANDLE_FILE, prints "ready", then waits
//                                          for a line on stdin before it frees the memory
//   legacy-open import HANDLE_FILE         opens the handle (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), reads its last byte,
//                                          closes it; prints one JSON line: bytes, open_ms, first_read_ms, close_ms, ok
// Built and driven by tools/scripts/legacy-open.sh.
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

static void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  fprintf(stderr, "legacy-open: %s: %s\n", what, s ? s : "unknown error");
  exit(1);
}
static double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: legacy-open export BYTES FILE | import FILE\n"); return 2; }
  check(cuInit(0), "cuInit");
  CUdevice dev;
  check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext ctx;
  check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  if (strcmp(argv[1], "export") == 0 && argc == 4) {
    unsigned long long bytes = strtoull(argv[2], nullptr, 10);
    CUdeviceptr ptr;
    check(cuMemAlloc(&ptr, bytes), "cuMemAlloc");
    check(cuMemsetD8(ptr, 0x5a, bytes), "cuMemsetD8");
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    CUipcMemHandle h;
    check(cuIpcGetMemHandle(&h, ptr), "cuIpcGetMemHandle");
    FILE* f = fopen(argv[3], "wb");
    if (!f || fwrite(&bytes, sizeof bytes, 1, f) != 1 || fwrite(&h, sizeof h, 1, f) != 1 || fclose(f) != 0) {
      fprintf(stderr, "legacy-open: cannot write %s\n", argv[3]);
      return 1;
    }
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) { /* the driver script closed the pipe: free and leave */ }
    check(cuMemFree(ptr), "cuMemFree");
    return 0;
  }
  if (strcmp(argv[1], "import") != 0) { fprintf(stderr, "legacy-open: unknown role %s\n", argv[1]); return 2; }
  unsigned long long bytes = 0;
  CUipcMemHandle h;
  FILE* f = fopen(argv[2], "rb");
  if (!f || fread(&bytes, sizeof bytes, 1, f) != 1 || fread(&h, sizeof h, 1, f) != 1) {
    fprintf(stderr, "legacy-open: cannot read %s\n", argv[2]);
    return 1;
  }
  fclose(f);
  CUdeviceptr ptr;
  double t0 = now_ms();
  check(cuIpcOpenMemHandle(&ptr, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle");
  double t1 = now_ms();
  unsigned char last = 0;
  check(cuMemcpyDtoH(&last, ptr + bytes - 1, 1), "cuMemcpyDtoH");
  double t2 = now_ms();
  check(cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle");
  double t3 = now_ms();
  printf("{\"bytes\":%llu,\"open_ms\":%.3f,\"first_read_ms\":%.3f,\"close_ms\":%.3f,\"ok\":%s}\n", bytes, t1 - t0,
         t2 - t1, t3 - t2, last == 0x5a ? "true" : "false");
  return last == 0x5a ? 0 : 1;
}
