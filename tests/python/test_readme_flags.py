"""README.md's flag table is the one `snapserve --help=markdown` prints
(scripts/readme_flags.py): a flag added, renamed or re-documented in
server/server_config.cc fails this test until the README is regenerated."""
import subprocess
import sys

from snapserve_testkit.paths import build_dir, ROOT


def test_readme_flag_table_is_the_binarys():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_flags.py"),
                        "--binary", str(build_dir() / "server" / "snapserve")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_flag_of_help_is_in_the_readme():
    """The same from the other side, through the plain --help: each flag has
    a row (so a broken markdown printer cannot pass by printing nothing)."""
    import re
    help_text = subprocess.run([str(build_dir() / "server" / "snapserve"), "--help"],
                               capture_output=True, text=True, timeout=60).stdout
    flags = re.findall(r"^  --([a-z0-9-]+)=VALUE$", help_text, re.M)
    assert len(flags) > 30, help_text
    readme = (ROOT / "README.md").read_text()
    missing = [f for f in flags if f"| `--{f}` |" not in readme]
    assert not missing, f"flags without a README row: {missing}"
