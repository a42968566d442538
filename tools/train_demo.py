"""Train 1bit's built-in demo model (the code is the package tools/demo_training/).

    PYTHONPATH=. python3 tools/train_demo.py --out DIR [--minutes 6.5] [--seed 0] [--smoke]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.demo_training import main  # noqa: E402

if __name__ == "__main__":
    main()
