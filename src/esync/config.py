"""Every default of an esync run, in one place (as the original ESync's config.py).

Edit a value here to change the default of the matching command-line flag or
environment variable; the flag or variable always wins over the value here.
`esync/options.py` (main.py's flags), `esync/transport/cluster.py` (PS_* variables),
`esync/infra/stateclient.py`, the launchers (`esync/launch/`), `esync/logs_tools/summary.py` and the state
server's API read these names; nothing else hard-codes one of these defaults.

Defaults that live elsewhere, and why:
- the state server's own settings (ESYNC_STATE_DB, ESYNC_SMOOTHING, ...) are in
  `stateserver/stateserver/settings.py`: they configure that server process, which may
  run on another host, not a training run;
- the launchers' own flags (`--workers`, `--servers`, `--slowdown`, the experiment's
  time budget and target) are in their parsers (`esync/launch/local.py`,
  `esync/launch/experiment.py`): they describe a launch, not a process of the job;
- how an algorithm is named and which flags select it is in `esync/registry.py`.
"""

# --- what to train -------------------------------------------------------------------
MODE = "local"                 # -m: local | sync | async | esync | ddp
NETWORK = "lenet"              # -n: see esync.models.NETWORKS
DATASET = "digits"             # --dataset: digits (embedded) | fashion-mnist | mnist
DATA_DIR = "data"              # -dd: holds fashion-mnist/ and mnist/ with the IDX files
SPLIT_BY_CLASS = False         # -s: non-IID partitions (each worker sees few classes)

# --- optimiser -----------------------------------------------------------------------
BATCH_SIZE = 64                # -b: samples per local iteration on each device
LEARNING_RATE = 0.05           # -l: SGD step of local, sync and async modes
LEARNING_RATE_LOCAL = LEARNING_RATE   # -ll: local SGD step of esync
LEARNING_RATE_GLOBAL = 1.0     # -gl: scale of the averaged model delta in esync
MOMENTUM = 0.9                 # --momentum: SGD momentum (0 = plain SGD, as MXNet's "sgd")
WEIGHT_DECAY = 0.0             # --weight-decay
DCASGD = False                 # -dcasgd: delay-compensated ASGD in async mode
BALANCE_BATCHES = False        # --balance-batches: ddp: each worker's batch in proportion
                               #   to its measured speed (the global batch: --global-batch)
MIN_BATCH = 8                  # --min-batch: the smallest batch --balance-batches gives
                               #   a worker (BatchNorm's statistics need a few samples)
GLOBAL_BATCH = "ranks"         # --global-batch: --balance-batches' global batch: -b times
                               #   the workers (ranks, LB-BSP's) or what the devices compute
                               #   while the fastest computes -b (fastest)
DCASGD_LAMDA = 0.04            # --dcasgd-lamda: the variance-control factor of DC-ASGD
AVERAGE = "steps"              # --average: how esync averages the round's deltas: mean
                               #   (the paper's), steps (weighted by each one's local
                               #   steps: won on both evidence workloads, docs/evidence.md)
                               #   or normalized (FedNova)
OUTER_MOMENTUM = 0.0           # --outer-momentum: esync's Nesterov momentum on the
                               #   averaged delta (0: the paper's plain average)

# --- how workers aggregate -------------------------------------------------------------
BACKEND = "ps"                 # --backend: ps (parameter servers) | allreduce (sync, esync)
COMPRESS = "none"              # --compress: none | fp16 | topk:R | threshold:T|auto:F | partial:K
ALLREDUCE_TIMEOUT = 300.0      # seconds a worker waits in one all-reduce before it gives
                               #   up (a hung peer; a dead one is noticed at once)

# --- shuffling (CorgiPile's two-level shuffle by default) ----------------------------
SHUFFLE = "random"             # --shuffle: random | corgipile | once | none (random:
                               #   the DataLoader's shuffle=True; 1/8 of the LM's data
                               #   in CorgiPile's blocks trained it much slower)
BLOCK_SIZE = 32                # --block-size: contiguous samples per CorgiPile block
BUFFER_RATIO = 0.1             # --buffer-ratio: share of the partition held in the buffer
BUFFER_MAX_MB = 256            # the most a CorgiPile buffer of shards holds, whatever the ratio
DATA_SPLIT = None              # --data-split: static | leased | whole; None: leased for
#                                shards in a job with a scheduler (and no -s 1); whole for
#                                map-style data where the job counts its epochs in samples
#                                (not -m ddp, not -s 1); static otherwise
LOG_SAMPLES = False            # --log-samples: each round's record lists its sample ids
LOADER_WORKERS = 0             # --loader-workers: DataLoader worker processes of main.py's
#                                loop over data read from disk (0: in the training process)
CACHE_FRACTION = 0.0           # --cache-fraction: share of a device's shard samples kept in
#                                memory after first use, never evicted (MinIO; 0: none)
DISK_BANDWIDTH = None          # --disk-bandwidth: MB/s of emulated storage for shard reads
REMOTE_PREP = None             # --remote-prep: prep-stall share of a round above which a
#                                worker started with --ray decodes on Ray tasks (None: never)
SEED = 0                       # --seed: model init, partitions and shuffles

# --- evaluation, logs and stop criteria ----------------------------------------------
EVAL_DURATION = 1              # -e: worker 0 evaluates every N rounds (0: never; local
                               #   mode: a round is N iterations)
EVAL_INTERVAL = 0.5            # --eval-interval: seconds between the evaluator's
                               #   evaluations (local mode: between in-process ones)
TARGET_HOLD = 0.0              # --target-hold: seconds the evaluator must see the target
                               #   accuracy held before it ends the job
LOG_DIR = "logs"               # -ld: LOG_DIR/<host>/<device>/iter-<n>.json
TENSORBOARD = None             # --tensorboard: where each process also writes TensorBoard
                               #   scalars (None: nowhere)
EPOCHS = None                  # --epochs: passes over the partition (None: no limit)
MAX_ROUNDS = None              # --max-rounds
TIME_LIMIT = None              # --time-limit: seconds of training
TARGET_ACCURACY = None         # --target-accuracy: stop once test accuracy reaches it
LOSS = "cross_entropy"         # --loss: the training loss (or module:function)
METRIC = "accuracy"            # --metric: accuracy | loss, what evaluations measure
EVALUATE = None                # --evaluate: module:function measuring the model itself
TARGET_LOSS = None             # --target-loss: stop once the evaluated loss falls to it

# --- devices and simulated heterogeneity ---------------------------------------------
USE_CPU = False                # -c: force the CPU even if -g is given
DEFAULT_GPU_ID = None          # -g: None means CPU; N means cuda:N
NUM_THREADS = 0                # --num-threads: torch intra-op threads (0: torch's default)
SLOWDOWN = 1.0                 # --slowdown: behave as a device this many times slower
BANDWIDTH = None               # --bandwidth: Mbit/s of this worker's emulated link (None:
                               #   not paced)
LATENCY = 0.0                  # --latency: ms of one-way delay on this worker's link

# --- ESync state server --------------------------------------------------------------
STATE_SERVER_IP = "127.0.0.1"  # -ip
STATE_SERVER_PORT = 10010      # -port; also where esync/launch/hosts.py starts the state server
ROUND_TIME = None              # --round-time: esync's seconds per round (None: the
                               #   slowest living device's time per iteration)
COORDINATION_SHARE = 0.1       # --coordination-share: esync makes a round long enough
                               #   that its synchronisation takes at most this share
                               #   (0: the paper's rule, the slowest device's iteration)
LEAST_SPEED = 0.2              # --least-speed: an esync device slower than this share of
                               #   the fastest's speed sits rounds out (0: every device
                               #   trains, the paper's rule; why 0.2: budget.py)
MAX_LOCAL_STEPS = 64           # --max-local-steps: the most local iterations of a round
                               #   (also the state server's, for a job created without it;
                               #   16 left fast devices waiting at 1,1,1,16: docs/evidence.md)
STATE_SERVER_PATIENCE = 60.0   # ESYNC_STATE_SERVER_PATIENCE: seconds a worker retries an
                               #   unreachable state server before it ends the job

# --- the cluster (ps-lite's variables) ------------------------------------------------
SCHEDULER_PORT = 9091          # DMLC_PS_ROOT_PORT that esync/launch/hosts.py gives (--port)
HEARTBEAT_INTERVAL = 1.0       # PS_HEARTBEAT_INTERVAL: seconds between a node's heartbeats
HEARTBEAT_TIMEOUT = 10.0       # PS_HEARTBEAT_TIMEOUT: seconds of silence = a dead node
START_TIMEOUT = 300.0          # --start-timeout: seconds a node waits to join the job, and
                               #   the scheduler for all nodes to register (0: for ever)

# --- surviving failures ----------------------------------------------------------------
CHECKPOINT_DIR = None          # --checkpoint-dir: where servers keep their shards'
                               #   checkpoints (None: no checkpoints)
CHECKPOINT_EVERY = "20"        # --checkpoint-every: N rounds of the model, or "Ns" seconds
KEEP_CHECKPOINTS = 3           # --keep-checkpoints: the newest K are kept per shard
ON_WORKER_FAILURE = "continue"  # --on-worker-failure: continue | abort
MIN_WORKERS = 1                # --min-workers: fewer living workers end the job
SERVER_PATIENCE = 60.0         # --server-patience: seconds the job waits for a dead
                               #   server's restart (0 without --checkpoint-dir)

# --- launchers and log tools ----------------------------------------------------------
RUNS_DIR = "runs"              # --out of esync/launch/local.py and esync/launch/experiment.py
