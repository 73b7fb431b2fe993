#!/usr/bin/env python3
"""Writes fuzz_env's seeds (tests/fuzz/corpus/fuzz_env/): each launcher's environment as it sets it,
in the harness's layout (fuzz_env.c: a byte naming the variable by its place in the harness's
table, then its value as a span). Run from the repository root."""
import os
import re
import struct

# the harness's table, read from it so that the two cannot drift apart
src = open("tests/fuzz/fuzz_env.c").read()
table = src[src.index("vars[] = {"):src.index("};", src.index("vars[] = {"))]
VARS = re.findall(r'"([A-Z_0-9]+)"', table)


def env(**kv):
    out = b""
    for k, v in kv.items():
        out += struct.pack("<BH", VARS.index(k), len(v)) + v.encode()
    return out


SEEDS = {
    "kolorun": env(KOLO_RANK="1", KOLO_SIZE="4", KOLO_LOCAL_RANK="1", KOLO_LOCAL_SIZE="2", KOLO_CROSS_RANK="0",
                   KOLO_CROSS_SIZE="2", KOLO_RENDEZVOUS="10.0.0.1:29400", KOLO_JOB_ID="kr-123", KOLO_SECRET="s3cret"),
    "kolorun_ipv6_rank0_serves": env(KOLO_RANK="0", KOLO_SIZE="2", KOLO_RENDEZVOUS="[fd00::1]:29400",
                                     KOLO_RENDEZVOUS_SERVER="rank0", KOLO_EPOCH="3"),
    "horovodrun": env(HOROVOD_RANK="3", HOROVOD_SIZE="4", HOROVOD_LOCAL_RANK="1", HOROVOD_LOCAL_SIZE="2",
                      HOROVOD_CROSS_RANK="1", HOROVOD_CROSS_SIZE="2", HOROVOD_GLOO_RENDEZVOUS_ADDR="10.0.0.1",
                      HOROVOD_GLOO_RENDEZVOUS_PORT="34567"),
    "horovodrun_rendezvous": env(HOROVOD_RANK="0", HOROVOD_SIZE="2", HOROVOD_LOCAL_RANK="0", HOROVOD_LOCAL_SIZE="1",
                                 KOLO_RENDEZVOUS="node1:29400"),
    "torchrun": env(RANK="2", WORLD_SIZE="4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", GROUP_RANK="1",
                    GROUP_WORLD_SIZE="2", MASTER_ADDR="node1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="job7",
                    TORCHELASTIC_RESTART_COUNT="1"),
    "openmpi_one_host": env(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK="1",
                            OMPI_COMM_WORLD_LOCAL_SIZE="2"),
    "mpich_hydra": env(PMI_RANK="1", PMI_SIZE="3", MPI_LOCALRANKID="1", MPI_LOCALNRANKS="3", PMI_KVSNAME="kvs_77_0"),
    "cray_pmi": env(PMI_RANK="5", PMI_SIZE="8", PMI_LOCAL_RANK="1", PMI_LOCAL_SIZE="4", PMI_JOBID="1234"),
    "pmix_with_size": env(PMIX_RANK="0", PMIX_SIZE="2", PMIX_NAMESPACE="prterun-host-123@1"),
    "slurm_srun": env(SLURM_PROCID="3", SLURM_NTASKS="4", SLURM_LOCALID="1", SLURM_NODEID="1", SLURM_NNODES="2",
                      SLURM_STEP_NODELIST="node[01-02]", SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_JOB_ID="4242",
                      SLURM_STEP_ID="0", SLURM_STEP_NUM_NODES="2", SLURM_LAUNCH_NODE_IPADDR="10.0.0.9"),
    "slurm_ranges": env(SLURM_PROCID="0", SLURM_NTASKS="6", SLURM_LOCALID="0", SLURM_NODEID="0",
                        SLURM_JOB_NODELIST="rack[1-2]-n[08-09,11],gpu5", SLURM_NTASKS_PER_NODE="1",
                        SLURM_TASKS_PER_NODE="2,1(x4)", SLURM_JOBID="99"),
    "trainjob_pet": env(PET_NNODES="2", PET_NODE_RANK="1", PET_NPROC_PER_NODE="1", PET_MASTER_ADDR="job-node-0-0.job",
                        PET_MASTER_PORT="29400"),
    "bad_rank_over_size": env(KOLO_RANK="4", KOLO_SIZE="4", KOLO_RENDEZVOUS="h:1"),
    "bytes_and_hostport": env(KOLO_START_TIMEOUT="5", KOLO_RENDEZVOUS="node1:65536", MASTER_PORT="64M"),
}

if __name__ == "__main__":
    d = "tests/fuzz/corpus/fuzz_env"
    os.makedirs(d, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(SEEDS), d))
