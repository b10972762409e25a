"""Golden files shared by the CLI tests of every suite.

After an intended change of output, regenerate them with ``KVPOLICY_UPDATE_GOLDEN=1 pytest`` and
review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def check_golden(path: Path, text: str) -> None:
    """Compare ``text`` with the golden file at ``path`` (rewrite it under KVPOLICY_UPDATE_GOLDEN).

    Policy digests change with every byte of a policy, a comment included; the digest itself is
    tested elsewhere, so golden files hold a placeholder.
    """
    text = re.sub(r"sha256 [0-9a-f]{12}", "sha256 <digest>", text)
    text = re.sub(r"  [0-9a-f]{12}  ", "  <digest>      ", text)
    if os.environ.get("KVPOLICY_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden file {path}; run with KVPOLICY_UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8")
