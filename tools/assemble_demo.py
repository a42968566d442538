"""Put the demo model back together from the files a device training run returned
(bench/gpu_train_demo.sh: model.safetensors.partNN + demo_model_files.tar), checking the sha256.

    python3 tools/assemble_demo.py FILES_DIR onebit/assets/demo

Same as `cat FILES_DIR/model.safetensors.part* > TARGET/model.safetensors` and
`tar -xf FILES_DIR/demo_model_files.tar -C TARGET` (then compare with PARTS.json's sha256).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.demo_training.package import assemble  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    manifest = assemble(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{sys.argv[2]}: model.safetensors {manifest['bytes']:,} bytes from {len(manifest['parts'])} pieces, "
          f"sha256 {manifest['sha256'][:16]}... verified")
