"""What the GPU checks on torch tensors (test_torch.py, test_large.py) share: torch and a CUDA
device or a skip (exit 77), the package from the source tree, one printed line per check, and
the run of the check groups, a crash in one reported while the others still run."""
import math
import os
import sys
import traceback

failures = []


def torch_or_skip():
    """torch, with a CUDA device; exits 77 (skipped) without either. Puts the source tree's
    python/ first on the path, so that `import kpt` takes this checkout's package."""
    try:
        import torch
    except ImportError:
        print("torch is not installed: skipped")
        sys.exit(77)
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        sys.exit(77)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "python"))
    return torch


def check(name, err, tol):
    ok = err <= tol and math.isfinite(err)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {err:.2e} (tolerance {tol:.0e})", flush=True)
    if not ok:
        failures.append(name)


def run(groups, after=None):
    """Runs each group (after each, `after(group)` if given), then prints the summary and exits:
    1 if any check failed or any group raised."""
    for fn in groups:
        try:
            fn()
        except Exception as e:  # a crash in one group is reported, the others still run
            traceback.print_exc()
            failures.append(f"{fn.__name__}: {e}")
        if after:
            after(fn)
    print(f"{'FAILED: ' + ', '.join(failures) if failures else 'all passed'}")
    sys.exit(1 if failures else 0)
