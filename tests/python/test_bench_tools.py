"""The parts of bench/'s developer tools that need no GPU: bench/ncu_source.py's reading of an
Nsight Compute source page (a small made-up CSV with ncu's preamble), bench/kernel_ab.py's case
lists, and bench/report.py against the record: docs/BENCHMARKS.md's generated section and the
plots must be what it makes of docs/bench/results.json. Run by pytest (conftest.py)."""
import importlib.util
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BENCH = os.path.join(ROOT, "bench")

# Six instructions: three in a loop run 100 times, two once an item (10 times), one never run;
# warp samples 60 / 30 / 10 and two stall reasons.
CSV = """==PROF== Connected to process 1234
==PROF== Profiling "kpt_attention": 0%....50%....100% - 2 passes
"Address","Source","Instructions Executed","Warp Stall Sampling (All Samples)","stall_long_sb","stall_math","stall_long_sb (Not Issued)"
"0x10","HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12]","100","30","25","5","99"
"0x20","MUFU.EX2 R1, R1","100","20","0","20","99"
"0x30","FADD R2, R1, R3","100","10","4","6","99"
"0x40","STG.E [R4], R2","10","20","20","0","99"
"0x50","BAR.SYNC 0x1","10","10","10","0","99"
"0x60","EXIT","0","10","1","0","99"
"""


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class NcuSource(unittest.TestCase):
    def run_tool(self, text, *args):
        path = os.path.join(self.tmp, "src.csv")
        with open(path, "w") as f:
            f.write(text)
        return subprocess.run([sys.executable, os.path.join(BENCH, "ncu_source.py"), path, *args],
                              capture_output=True, text=True)

    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.tmp = self._dir.name

    def tearDown(self):
        self._dir.cleanup()

    def test_shares_by_loop(self):
        r = self.run_tool(CSV, "--top", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        # the loop count is guessed as 100 (the most common count above the median run one)
        self.assertIn("6 instructions, 100 samples; loop count 100", lines[0])
        self.assertIn("loop 60.0 %", lines[0])
        self.assertIn("other 30.0 %", lines[0])
        self.assertIn("never 10.0 %", lines[0])
        # the two instructions with the most samples, with their main stall reasons
        self.assertIn("30.00 %", lines[1])
        self.assertIn("HGMMA", lines[1])
        self.assertTrue(lines[1].rstrip().endswith("long_sb math"), lines[1])
        self.assertIn("MUFU.EX2", lines[2])
        self.assertEqual(len(lines), 3)

    def test_by_count(self):
        r = self.run_tool(CSV, "--top", "0", "--by-count", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 3, r.stdout)
        # groups by samples: the loop (3 instructions, 60 %), then once an item (2, 30 %); each
        # group's reasons as shares of its own stall samples
        self.assertRegex(lines[1], r"exec +100:     3 instructions,  60\.0 % of samples; "
                                   r"math 52 %, long_sb 48 %")
        self.assertRegex(lines[2], r"exec +10:     2 instructions,  30\.0 % of samples; "
                                   r"long_sb 100 %, math 0 %")

    def test_loop_given(self):
        r = self.run_tool(CSV, "--top", "0", "--loop", "10")
        self.assertIn("loop 30.0 %", r.stdout)
        self.assertIn("other 60.0 %", r.stdout)

    def test_no_table(self):
        r = self.run_tool("==PROF== nothing profiled\n")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no source table", r.stderr)


class KernelAbCases(unittest.TestCase):
    def test_parse_cases(self):
        ab = load("kernel_ab")
        self.assertEqual(ab.parse_cases("causal:1024:128,full:16384:64", "--forward"),
                         [("causal", 1024, 128), ("full", 16384, 64)])
        # the head dim may be left out where a default is given
        self.assertEqual(ab.parse_cases("softcap+causal:4096", "--backward", dim=128),
                         [("softcap+causal", 4096, 128)])
        for bad in ("causal:1024", "causal:0:128", "causal", ":1024:128"):
            with self.assertRaises(ValueError) as e:
                ab.parse_cases(bad, "--forward")
            self.assertIn(f"'{bad}'", str(e.exception))
            self.assertIn("PATTERN:LENGTH:HEAD_DIM", str(e.exception))


class Report(unittest.TestCase):
    def test_the_record_is_generated(self):
        """report.py rerun on the kept JSON, into a copy of the page: the same page, the same
        plots (a hand edit of the generated tables, or a report.py change not rerun, fails)."""
        docs = os.path.join(ROOT, "docs")
        with tempfile.TemporaryDirectory() as tmp:
            page, plots = os.path.join(tmp, "BENCHMARKS.md"), os.path.join(tmp, "bench")
            shutil.copyfile(os.path.join(docs, "BENCHMARKS.md"), page)
            os.mkdir(plots)
            r = subprocess.run([sys.executable, os.path.join(BENCH, "report.py"),
                                os.path.join(docs, "bench", "results.json"), "--doc", page,
                                "--plots", plots, "--keep-json"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(filecmp.cmp(page, os.path.join(docs, "BENCHMARKS.md"), shallow=False),
                            "docs/BENCHMARKS.md's generated section is not report.py's output "
                            "for docs/bench/results.json: rerun `python3 bench/report.py "
                            "docs/bench/results.json --keep-json`")
            svgs = sorted(n for n in os.listdir(plots) if n.endswith(".svg"))
            self.assertEqual(svgs, sorted(n for n in os.listdir(os.path.join(docs, "bench"))
                                          if n.endswith(".svg")))
            for n in svgs:
                self.assertTrue(filecmp.cmp(os.path.join(plots, n),
                                            os.path.join(docs, "bench", n), shallow=False), n)


if __name__ == "__main__":
    unittest.main()
