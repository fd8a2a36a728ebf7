"""pytest setup for the Python package: the package from the source tree (python/), the
library from $KPT_LIB (meson test sets it to the build's libkpt), torch's custom ops off unless
$KPT_TORCH_TESTS is set (importing torch costs seconds and it is rarely installed in CI)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
os.environ.setdefault("KPT_EXAMPLES", os.path.join(HERE, "..", "..", "examples"))
if not os.environ.get("KPT_TORCH_TESTS"):
    os.environ["KPT_NO_TORCH"] = "1"

import kpt  # noqa: E402

kpt.library(os.environ.get("KPT_LIB"))
