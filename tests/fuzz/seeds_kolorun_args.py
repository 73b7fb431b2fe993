#!/usr/bin/env python3
"""Writes fuzz_kolorun_args' seeds (tests/fuzz/corpus/fuzz_kolorun_args/): real kolorun command lines,
Horovod config files, hostfiles and batch allocations, each an input in the harness's layout
(fuzz_kolorun_args.c), from which the fuzzer garbles its way. Run from the repository root; rewrites
the seeds it names, leaves the others (kept findings) alone."""
import os
import struct

NONE, SLURM, PBS, LSF = range(4)
SLURM_NODELIST, SLURM_CPUS, SLURM_JOB_ID, STATUS_SIGNAL = 4, 8, 16, 32


def span(b):
    return struct.pack("<H", len(b)) + b


def seed(args, sys=NONE, config="", hostfile="", alloc="", counts=""):
    """args: the words after kolorun, split at spaces, or a list ('@CONFIG@', '@HOSTFILE@' name the files)."""
    argv = b"".join(w.encode() + b"\0" for w in (args.split() if isinstance(args, str) else args))
    return bytes([sys]) + b"".join(span(x if isinstance(x, bytes) else x.encode())
                                   for x in (argv, config, hostfile, alloc, counts))


HOROVOD_CONFIG = """\
# horovodrun --config-file
controller: gloo
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 3.5
  cache_capacity: 2048
  hierarchical_allreduce: false
autotune:
  enabled: true
  log_file: "/tmp/autotune.csv"
  warmup_samples: 3
  steps_per_sample: 10
  bayes_opt_max_samples: 20
  gaussian_process_noise: 0.8
timeline:
  filename: 'timeline.json'
  mark_cycles: yes
stall_check:
  enabled: true
  warning_time_seconds: 60
  shutdown_time_seconds: 0
library_options:
  gloo_timeout_seconds: 45
logging:
  level: WARNING
  with_timestamp: off
"""

SEEDS = {
    "hosts_np": seed("-np 4 -H a:2,b:2 python train.py"),
    "hosts_default_slots": seed("-H node1,node2:3,localhost:1 --verbose -- python -u train.py --lr 0.1"),
    "local_np": seed("-np 2 --bind-to core --map-by socket --report-bindings python train.py"),
    "config_file": seed("-np 2 --config-file @CONFIG@ --cycle-time-ms 5 python train.py", config=HOROVOD_CONFIG),
    "config_equals_crlf_bom": seed("-np 1 --config-file=@CONFIG@ python train.py",
                                   config="\ufeffparams:\r\n    cache_capacity: 0\r\n---\r\n"
                                          "logging:\r\n    level: 'debug'\r\n"),
    "config_refused": seed("-np 1 --config-file @CONFIG@ python t.py",
                           config="controller: mpi\nlibrary_options:\n  num_nccl_streams: 2\n"),
    "hostfile_slots": seed("--hostfile @HOSTFILE@ python train.py",
                           hostfile="# cluster\nnode1 slots=4 max_slots=8\nnode2 slots=4\n\nnode3:2  # MPICH\nnode4\n"),
    "hostfile_np": seed("-np 6 -hostfile @HOSTFILE@ --output-filename out --tag-output=none python t.py",
                        hostfile="gpu-01 slots=4\ngpu-02\tslots=4\n"),
    "slurm_nodelist": seed("python train.py", sys=SLURM | SLURM_JOB_ID,
                           alloc="node[01-04,07],gpu[1-2]-n[08-09]", counts="4(x2),2(x3),1,8(x3)"),
    "slurm_cpus_srun": seed("-np 8 --launcher srun python train.py",
                            sys=SLURM | SLURM_NODELIST | SLURM_CPUS | SLURM_JOB_ID,
                            alloc="rack1-n[1-4]", counts="2(x4)"),
    "slurm_local_only": seed("python train.py", sys=SLURM, alloc="localhost", counts="3"),
    "pbs_nodefile": seed("-np 5 python train.py", sys=PBS, alloc="n1\nn1\nn2\nn2\nn2\nn3 extra\n"),
    "lsf_hosts": seed("python train.py", sys=LSF, alloc="hostA 4 hostB 4  hostC 1"),
    "elastic": seed("-np 4 --min-np 2 --max-np 8 --host-discovery-script ./discover.sh --slots-per-host 2 "
                    "--elastic-timeout 60 --reset-limit 3 --blacklist-cooldown-range 10 100 python train.py"),
    "elastic_hosts": seed("--min-np 2 --max-np 4 -H a:2,b:2 --blacklist-cooldown-range=5,50 python t.py"),
    "output_and_timeouts": seed("-np 3 --output-ranks 0,2-5 --merge-output 0.5 --timeout 600 --get-stack-traces "
                                "--grace-seconds 2 --start-timeout 20 --status-file st.json --prefix-timestamp "
                                "python t.py", sys=STATUS_SIGNAL, counts="12.5"),
    "engine_settings": seed("-np 2 -x PATH -x NCCL_DEBUG=INFO --fusion-threshold-mb 64 --cache-capacity 1024 "
                            "--timeline-filename tl.json --timeline-mark-cycles --no-stall-check "
                            "--stall-check-warning-time-seconds 30 --log-level warn --network-interfaces eth0,eth1 "
                            "--tcp --hierarchical-allgather --no-hierarchical-allreduce --autotune "
                            "--autotune-log-file at.csv --autotune-warmup-samples 2 --autotune-steps-per-sample 5 "
                            "--autotune-bayes-opt-max-samples 10 --autotune-gaussian-process-noise 0.5 "
                            "--log-with-timestamp --gloo --disable-cache --no-torus-allreduce python t.py"),
    "ssh_options": seed(["-np", "2", "-H", "h1,h2", "-p", "2222", "-i", "id_ed25519", "--ssh", "ssh -q",
                          "--local-address", "10.0.0.1", "python", "t.py"]),
    "horovod_only": seed("-np 2 --mpi-args=--oversubscribe python t.py"),
    # found: a Slurm list from the environment named a host starting with '-' (an ssh option)
    "slurm_host_starting_with_dash": seed("python train.py", sys=SLURM | SLURM_NODELIST | SLURM_CPUS | STATUS_SIGNAL,
                                          alloc="-cbe[02-04,07],gpu[1-2]-n[08-09]", counts="4(x2),2(x3),1,8(x3)"),
    # found: fgets handed a long line's tail over as a line of its own: a comment's tail was a host
    "hostfile_long_comment_tail_read_as_host": seed("--hostfile @HOSTFILE@ python t.py",
                                                    hostfile="#" + "x" * 4094 + "evil slots=9\nnode1\n"),
    "hostfile_nul_byte": seed("--hostfile @HOSTFILE@ python t.py", hostfile="node1\0 slots=4\nnode2\n"),
    "pbs_long_line": seed("python t.py", sys=PBS, alloc="n1" + " " * 300 + "n2\nn3\n"),
    # found: every host compared with every other, and every rank with every host: hours for
    # 100000 nodes (now under a second)
    "slurm_100000_nodes": seed("python t.py", sys=SLURM, alloc="n[1-100000]", counts="1(x100000)"),
    "help": seed("--help"),
    "check_build": seed("-cb"),
}

if __name__ == "__main__":
    d = "tests/fuzz/corpus/fuzz_kolorun_args"
    os.makedirs(d, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(SEEDS), d))
