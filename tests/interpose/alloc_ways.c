/*
 * alloc_ways.c: obtains and releases GPU memory in every way the interposer
 * counts, through the driver found as argv[1] says (see cuda_api.h), and
 * stops at checkpoints ("at LABEL DEV0 DEV1 HOST", the fake driver's truth)
 * until the test, reading the counters from another process, answers.
 */
#include "cuda_api.h"

#define MIB (1ULL << 20)

int main(int argc, char **argv) {
    struct api a;
    CUdeviceptr p1, p2, p3, p4, pa, pb, ipc;
    size_t pitch;
    CUhandle h0, h1, hh, imported, shared;
    CUmemAllocationProp prop;
    CUmemPoolProps pprops;
    CUpool pool;
    CUarray arr, arr3, mip;
    CUDA_ARRAY_DESCRIPTOR d2 = {100, 100, 0x20, 4};
    CUDA_ARRAY3D_DESCRIPTOR d3 = {64, 32, 8, 0x01, 2, 0};
    CUDA_ARRAY3D_DESCRIPTOR dm = {64, 64, 0, 0x10, 1, 0};
    CUipcMemHandle ipch;
    void *hp1, *hp2, *reg;
    int has_vmm;

    if (argc < 2) {
        fprintf(stderr, "usage: alloc_ways dlsym|proc|proc-ptds|proc-v1|linked\n");
        return 2;
    }
    load_api(&a, argv[1]);
    if (!a.used || !a.cuInit || !a.cuMemAlloc_v2 || !a.cuMemFree_v2) {
        fprintf(stderr, "driver functions missing\n");
        return 2;
    }
    has_vmm = a.cuMemCreate != NULL;
    CHECK(a.cuInit(0));
    use_device(&a, 0);
    checkpoint(&a, "start");

    /* plain, pitched, managed */
    CHECK(a.cuMemAlloc_v2(&p1, 1 * MIB));
    CHECK(a.cuMemAlloc_v2(&p2, 3 * MIB));
    checkpoint(&a, "plain");
    CHECK(a.cuMemAllocPitch_v2(&p3, &pitch, 1000, 100, 4));
    CHECK(a.cuMemAllocManaged(&p4, 5 * MIB, 1));
    checkpoint(&a, "pitch-managed");
    CHECK(a.cuMemFree_v2(p2));
    CHECK(a.cuMemFree_v2(p3));
    checkpoint(&a, "freed-some");
    CHECK(a.cuMemFree_v2(p1));
    CHECK(a.cuMemFree_v2(p4));
    /* bad frees pass through, counted as untracked, never crash */
    EXPECT_RC(1, a.cuMemFree_v2(p1));
    EXPECT_RC(1, a.cuMemFree_v2(0x1234));
    checkpoint(&a, "freed-all");

    if (has_vmm) {
        /* VMM: handles count once, maps count nothing, imports never */
        memset(&prop, 0, sizeof prop);
        prop.type = 1;
        prop.location.type = 1;
        prop.location.id = 0;
        CHECK(a.cuMemCreate(&h0, 2 * MIB, &prop, 0));
        prop.location.id = 1;
        CHECK(a.cuMemCreate(&h1, 4 * MIB, &prop, 0));
        prop.location.type = 2;
        prop.location.id = 0;
        CHECK(a.cuMemCreate(&hh, 1 * MIB, &prop, 0));
        checkpoint(&a, "vmm");
        CHECK(a.cuMemExportToShareableHandle(&shared, h0, 1, 0));
        CHECK(a.cuMemImportFromShareableHandle(&imported, (void *)(uintptr_t)shared, 1));
        checkpoint(&a, "vmm-imported");
        CHECK(a.cuMemRelease(imported));
        checkpoint(&a, "vmm-import-released");
        CHECK(a.cuMemRelease(h0));
        CHECK(a.cuMemRelease(h1));
        CHECK(a.cuMemRelease(hh));
        checkpoint(&a, "vmm-released");

        /* stream-ordered pools: what the pool reserves */
        CHECK(a.cuMemAllocAsync(&pa, 3 * MIB, NULL));
        checkpoint(&a, "async");
        CHECK(a.cuMemAllocAsync(&pb, 1 * MIB, NULL));
        checkpoint(&a, "async-reused");
        CHECK(a.cuMemFreeAsync(pa, NULL));
        CHECK(a.cuMemFreeAsync(pb, NULL));
        checkpoint(&a, "async-freed");
        CHECK(a.cuStreamSynchronize(NULL));
        checkpoint(&a, "async-synchronized");
        memset(&pprops, 0, sizeof pprops);
        pprops.allocType = 1;
        pprops.location.type = 1;
        pprops.location.id = 1;
        CHECK(a.cuMemPoolCreate(&pool, &pprops));
        CHECK(a.cuMemAllocFromPoolAsync(&pa, 5 * MIB, pool, NULL));
        checkpoint(&a, "pool");
        CHECK(a.cuMemFreeAsync(pa, NULL));
        CHECK(a.cuMemAllocFromPoolAsync(&pa, 1 * MIB, pool, NULL));
        CHECK(a.cuMemPoolTrimTo(pool, 0));
        checkpoint(&a, "pool-trimmed");
        CHECK(a.cuMemPoolDestroy(pool));
        checkpoint(&a, "pool-destroyed");
        /* cuMemAlloc'd memory freed in stream order */
        CHECK(a.cuMemAlloc_v2(&p1, 2 * MIB));
        CHECK(a.cuMemFreeAsync(p1, NULL));
        checkpoint(&a, "plain-freed-async");
    }

    /* arrays */
    CHECK(a.cuArrayCreate_v2(&arr, &d2));
    CHECK(a.cuArray3DCreate_v2(&arr3, &d3));
    if (a.cuMipmappedArrayCreate) {
        CHECK(a.cuMipmappedArrayCreate(&mip, &dm, 4));
    }
    checkpoint(&a, "arrays");
    CHECK(a.cuArrayDestroy(arr));
    CHECK(a.cuArrayDestroy(arr3));
    if (a.cuMipmappedArrayDestroy) {
        CHECK(a.cuMipmappedArrayDestroy(mip));
    }
    checkpoint(&a, "arrays-destroyed");

    /* pinned host memory, apart */
    CHECK(a.cuMemHostAlloc(&hp1, 1 * MIB, 0));
    CHECK(a.cuMemAllocHost_v2(&hp2, 2 * MIB));
    reg = malloc(3 * MIB);
    CHECK(a.cuMemHostRegister_v2(reg, 3 * MIB, 0));
    memset(hp1, 1, MIB);
    checkpoint(&a, "pinned");
    CHECK(a.cuMemFreeHost(hp1));
    CHECK(a.cuMemFreeHost(hp2));
    CHECK(a.cuMemHostUnregister(reg));
    EXPECT_RC(713, a.cuMemHostUnregister(reg));
    free(reg);
    checkpoint(&a, "pinned-freed");

    /* IPC: the mapping is the exporter's memory, counted once */
    CHECK(a.cuMemAlloc_v2(&p1, 1 * MIB));
    CHECK(a.cuIpcGetMemHandle(&ipch, p1));
    CHECK(a.cuIpcOpenMemHandle_v2(&ipc, ipch, 1));
    checkpoint(&a, "ipc");
    CHECK(a.cuIpcCloseMemHandle(ipc));
    CHECK(a.cuMemFree_v2(p1));
    checkpoint(&a, "ipc-closed");

    /* device 1, then an allocation the device cannot hold */
    use_device(&a, 1);
    CHECK(a.cuMemAlloc_v2(&p1, 7 * MIB));
    checkpoint(&a, "device1");
    EXPECT_RC(2, a.cuMemAlloc_v2(&p2, 1ULL << 50));
    CHECK(a.cuMemFree_v2(p1));
    checkpoint(&a, "oom");
    printf("done\n");
    return 0;
}
