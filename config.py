"""Every default of an esync run, in one place (as the original ESync's config.py).

Edit a value here to change the default of the matching command-line flag; the flag
always wins over the value here. `esync/options.py` reads these names and nothing
else in the project hard-codes a default.
"""

# --- what to train -------------------------------------------------------------------
MODE = "local"                 # -m: local | sync | async | esync
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
DCASGD_LAMDA = 0.04            # --dcasgd-lamda: the variance-control factor of DC-ASGD

# --- shuffling (CorgiPile's two-level shuffle by default) ----------------------------
SHUFFLE = "corgipile"          # --shuffle: corgipile | once | none
BLOCK_SIZE = 32                # --block-size: contiguous samples per CorgiPile block
BUFFER_RATIO = 0.1             # --buffer-ratio: share of the partition held in the buffer
SEED = 0                       # --seed: model init, partitions and shuffles

# --- evaluation, logs and stop criteria ----------------------------------------------
EVAL_DURATION = 1              # -e: evaluate every N rounds (local mode: round = N iterations)
LOG_DIR = "logs"               # -ld: LOG_DIR/<host>/<device>/iter-<n>.json
EPOCHS = None                  # --epochs: passes over the partition (None: no limit)
MAX_ROUNDS = None              # --max-rounds
TIME_LIMIT = None              # --time-limit: seconds of training
TARGET_ACCURACY = None         # --target-accuracy: stop once test accuracy reaches it

# --- devices and simulated heterogeneity ---------------------------------------------
USE_CPU = False                # -c: force the CPU even if -g is given
DEFAULT_GPU_ID = None          # -g: None means CPU; N means cuda:N
NUM_THREADS = 0                # --num-threads: torch intra-op threads (0: torch's default)
SLOWDOWN = 1.0                 # --slowdown: behave as a device this many times slower

# --- ESync state server --------------------------------------------------------------
STATE_SERVER_IP = "127.0.0.1"  # -ip
STATE_SERVER_PORT = 10010      # -port
MAX_LOCAL_STEPS = 16           # --max-local-steps: the most local iterations of a round
