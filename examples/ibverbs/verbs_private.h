/* The provider side of libibverbs' private ABI (IBVERBS_PRIVATE_34), as far
 * as a provider loaded by the real libibverbs 44 (Debian 12) needs it.
 *
 * rdma-core does not install these declarations (they live in its
 * libibverbs/driver.h), so they are written out here from the layout the
 * installed library expects. They were checked against the disassembly of
 * libibverbs.so.1.14.44.0: ibv_create_qp@@IBVERBS_1.1 jumps through
 * priv->ops + 0xb0 (slot VOPS_create_qp = 19, ops at priv + 0x18),
 * ibv_modify_qp through + 0x190 (slot 47), ibv_reg_mr_iova2 through + 0x238
 * (slot 68), ibv_close_device through + 0x150 (slot 39); verbs_open_device
 * calls the device ops' alloc_context at + 0x28 and reads verbs_device.sysfs
 * at ibv_device + 0x2b8 (see fakeverbs.c for the static checks).
 *
 * Only the public structs (struct ibv_context, ibv_qp, ibv_wc, ...) come from
 * <infiniband/verbs.h>, so every layout a tracer reads is the real one. */
#ifndef OTELBPF_VERBS_PRIVATE_H
#define OTELBPF_VERBS_PRIVATE_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How a provider is matched to a device found in sysfs. */
enum { VMATCH_SENTINEL = 0, VMATCH_PCI = 1, VMATCH_MODALIAS = 2, VMATCH_DRIVER_ID = 3 };

struct verbs_match_ent {
    void *driver_data;
    union {
        const char *modalias;   /* fnmatch() pattern, e.g. "rdma_device:Nname*" */
        uint64_t driver_id;
    } u;
    uint16_t vendor;
    uint16_t device;
    uint8_t kind;
};

struct verbs_sysfs_dev;  /* opaque to this provider */

struct verbs_device_ops {
    const char *name;
    uint32_t match_min_abi_version;
    uint32_t match_max_abi_version;
    const struct verbs_match_ent *match_table;
    const struct verbs_device_ops **static_providers;
    bool (*match_device)(struct verbs_sysfs_dev *sysfs_dev);
    struct verbs_context *(*alloc_context)(struct ibv_device *device, int cmd_fd, void *private_data);
    struct verbs_context *(*import_context)(struct ibv_device *device, int cmd_fd);
    struct verbs_device *(*alloc_device)(struct verbs_sysfs_dev *sysfs_dev);
    void (*uninit_device)(struct verbs_device *device);
};

struct verbs_device {
    struct ibv_device device;  /* must be first */
    const struct verbs_device_ops *ops;
    int refcount;              /* atomic_int in rdma-core */
    void *entry[2];            /* struct list_node */
    struct verbs_sysfs_dev *sysfs;
    uint64_t core_support;
};

/* struct verbs_mr: what ibv_reg_mr's provider op returns. ibv_dereg_mr reads
 * mr_type and access behind the public struct. */
struct verbs_mr {
    struct ibv_mr ibv_mr;
    int mr_type;               /* 0 = IBV_MR_TYPE_MR */
    int access;
};

/* struct verbs_context_ops: 76 function pointers in alphabetical order.
 * Declared as slots so that only the operations a provider implements need
 * names; the slot numbers are the member positions in rdma-core 44. */
enum verbs_op_slot {
    VOPS_alloc_pd = 5,
    VOPS_create_cq = 15,
    VOPS_create_qp = 19,
    VOPS_create_qp_ex = 20,
    VOPS_dealloc_pd = 26,
    VOPS_dereg_mr = 28,
    VOPS_destroy_cq = 31,
    VOPS_destroy_qp = 34,
    VOPS_free_context = 39,
    VOPS_modify_qp = 47,
    VOPS_poll_cq = 53,
    VOPS_post_recv = 54,
    VOPS_post_send = 55,
    VOPS_query_device_ex = 58,
    VOPS_query_port = 60,
    VOPS_reg_mr = 68,
    VOPS_req_notify_cq = 69,
    VOPS_COUNT = 76,
};

struct verbs_context_ops {
    void *slot[VOPS_COUNT];
};

/* Exported by libibverbs under IBVERBS_PRIVATE_34. */
void verbs_register_driver_34(const struct verbs_device_ops *ops);
void *_verbs_init_and_alloc_context(struct ibv_device *device, int cmd_fd, size_t alloc_size,
                                    struct verbs_context *context_offset, uint32_t driver_id);
void verbs_uninit_context(struct verbs_context *context);
void verbs_set_ops(struct verbs_context *vctx, const struct verbs_context_ops *ops);

#endif
