"""Suite-wide test settings: one torch thread (CI has 2 cores; thread oversubscription makes timings and
run times erratic) and a non-interactive matplotlib backend."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(1)
