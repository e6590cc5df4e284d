// nvcc_graphs: a real nvcc 13 program that captures a CUDA graph and replays it, builds one node by
// node, and then misuses graphs the ways the agent must survive. Built by the tests
// (tests/examples/test_cuda_graphs.py) with -cudart shared and with nvcc's default static runtime.
// With a second argument, prints "ready" and waits for that file before its first CUDA call
// (registration is done by then: an agent attached meanwhile attaches "late"). Prints one JSON line: what it did, and what each call returned (35 from NVIDIA's runtime without
// a driver; 0 or CUDA's graph errors on the stand-in libcudart.so.13, which runs graphs as CUDA 13
// does: captures record, launches of an executable graph queue its kernels).
//
//   0. one plain launch (runs: counted as a launch)
//   1. capture on the per-thread stream: add_one, scale, add_one; instantiate; replay N times; sync
//   2. build a graph node by node (cudaGraphAddKernelNode: scale); instantiate; launch 10 times
//   3. a capture invalidated: a synchronize of the capturing stream (900), its end returns 901
//   4. an update refused (3 nodes from a 1-node graph: 910), one accepted (graph 2 now runs
//      add_one), one launch of graph 2; its node set back to scale in the executable graph
//      (cudaGraphExecKernelNodeSetParams), one launch more
//   5. graph 1 launched, destroyed at once (no synchronize), launched again (an error)
//   6. a capture begun and never ended (the process exits in it)
#include <cstdio>
#include <cstdlib>

#include "report.h"

__global__ void add_one(float *x)
{
    x[threadIdx.x] += 1.0f;
}

__global__ void scale(float *x, float by)
{
    x[threadIdx.x] *= by;
}

int main(int argc, char **argv)
{
    long replays = argc > 1 ? atol(argv[1]) : 100;
    if (argc > 2) {
        printf("ready\n");
        fflush(stdout);
        wait_before_launching(0, argv[2]);
    }
    Report r;
    cudaStream_t s = cudaStreamPerThread;
    float *d = nullptr;
    r.rc("cudaMalloc", cudaMalloc(&d, 32 * sizeof(float)));
    float by = 2.0f;
    add_one<<<1, 32, 0, s>>>(d);

    // 1. capture and replay
    cudaGraph_t g1 = nullptr;
    cudaGraphExec_t e1 = nullptr;
    r.rc("cudaStreamBeginCapture", cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    add_one<<<1, 32, 0, s>>>(d);
    scale<<<1, 32, 0, s>>>(d, by);
    add_one<<<1, 32, 0, s>>>(d);
    r.rc("cudaStreamEndCapture", cudaStreamEndCapture(s, &g1));
    r.rc("cudaGraphInstantiate", cudaGraphInstantiate(&e1, g1, 0));
    for (long i = 0; i < replays; i++)
        r.rc("cudaGraphLaunch", cudaGraphLaunch(e1, s));
    r.rc("cudaStreamSynchronize", cudaStreamSynchronize(s));

    // 2. built node by node
    cudaGraph_t g2 = nullptr;
    cudaGraphExec_t e2 = nullptr;
    cudaGraphNode_t node = nullptr, node2 = nullptr;
    r.rc("cudaGraphCreate", cudaGraphCreate(&g2, 0));
    void *args[] = {&d, &by};
    cudaKernelNodeParams p = {};
    p.func = (void *)scale;
    p.gridDim = dim3(1);
    p.blockDim = dim3(32);
    p.kernelParams = args;
    r.rc("cudaGraphAddKernelNode", cudaGraphAddKernelNode(&node2, g2, nullptr, 0, &p));
    r.rc("cudaGraphInstantiate", cudaGraphInstantiate(&e2, g2, 0));
    for (int i = 0; i < 10; i++)
        r.rc("cudaGraphLaunch", cudaGraphLaunch(e2, s));
    r.rc("cudaStreamSynchronize", cudaStreamSynchronize(s));

    // 3. a capture invalidated
    cudaGraph_t g_bad = nullptr;
    r.rc("cudaStreamBeginCapture", cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    add_one<<<1, 32, 0, s>>>(d);
    r.rc("cudaStreamSynchronize", cudaStreamSynchronize(s));
    r.rc("cudaStreamEndCapture", cudaStreamEndCapture(s, &g_bad));

    // 4. updates
    cudaGraph_t g3 = nullptr;
    cudaGraphExecUpdateResultInfo info = {};
    r.rc("cudaGraphExecUpdate", cudaGraphExecUpdate(e1, g2, &info)); // 3 nodes from 1: refused
    r.rc("cudaGraphCreate", cudaGraphCreate(&g3, 0));
    void *args3[] = {&d};
    p.func = (void *)add_one;
    p.kernelParams = args3;
    r.rc("cudaGraphAddKernelNode", cudaGraphAddKernelNode(&node, g3, nullptr, 0, &p));
    r.rc("cudaGraphExecUpdate", cudaGraphExecUpdate(e2, g3, &info)); // same shape: graph 2 now runs add_one
    r.rc("cudaGraphLaunch", cudaGraphLaunch(e2, s));
    p.func = (void *)scale; // graph 2's node (from g2) back to scale, in the executable graph only
    p.kernelParams = args;
    r.rc("cudaGraphExecKernelNodeSetParams", cudaGraphExecKernelNodeSetParams(e2, node2, &p));
    r.rc("cudaGraphLaunch", cudaGraphLaunch(e2, s));

    // 5. destroyed while launched, then launched again
    r.rc("cudaGraphLaunch", cudaGraphLaunch(e1, s));
    r.rc("cudaGraphExecDestroy", cudaGraphExecDestroy(e1));
    r.rc("cudaGraphLaunch", cudaGraphLaunch(e1, s));
    r.rc("cudaStreamSynchronize", cudaStreamSynchronize(s));
    r.rc("cudaGraphExecDestroy", cudaGraphExecDestroy(e2));
    r.rc("cudaGraphDestroy", cudaGraphDestroy(g1));
    r.rc("cudaGraphDestroy", cudaGraphDestroy(g2));
    r.rc("cudaGraphDestroy", cudaGraphDestroy(g3));

    // 6. a capture never ended
    r.rc("cudaStreamBeginCapture", cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    add_one<<<1, 32, 0, s>>>(d);

    printf("{\"program\": \"nvcc_graphs\", \"pid\": %d, \"replays\": %ld, ", getpid(), replays);
    r.print();
    printf("}\n");
    fflush(stdout);
    return 0;
}
