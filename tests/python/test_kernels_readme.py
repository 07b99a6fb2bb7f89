"""kernels/README.md's table of op families is the folder tree: every folder
under kernels/ has a row, every file a row names exists, and every source file
of a folder is named by its row (or by another row that dispatches it). Also
the layout rule that the ISA target attributes live in one header. Reads the
source tree only; needs no build."""
import re

from snapserve_testkit.paths import ROOT

KERNELS = ROOT / "kernels"
README = KERNELS / "README.md"
ISA_HEADER = KERNELS / "cpu" / "x86" / "isa_target.h"
SOURCE_SUFFIXES = {".h", ".cc", ".cu"}


def table_rows():
    """{folder: [file paths named by its row]} from the README's family table:
    the rows whose first cell is a backticked folder ending in '/'."""
    rows = {}
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([a-z0-9_/]+)/`", cells[0]) if cells else None
        if not m:
            continue
        folder = m.group(1)
        assert folder not in rows, f"two rows for {folder}/"
        # cells[1] is the op in words; the files start at cells[2].
        names = [n for cell in cells[2:] for n in re.findall(r"`([^`]+)`", cell)]
        rows[folder] = [KERNELS / n if "/" in n else KERNELS / folder / n for n in names]
    return rows


def kernel_folders():
    return sorted(p.relative_to(KERNELS).as_posix() for p in KERNELS.rglob("*")
                  if p.is_dir() and "__pycache__" not in p.parts)


def test_table_has_rows_for_the_families():
    rows = table_rows()
    # The parser found the table (a broken one cannot pass by yielding nothing).
    for family in ("linear", "paged_attention", "cpu", "cpu/x86", "quant"):
        assert family in rows, f"no row for {family}/ in {README}"
    assert all(rows.values()), [f for f, files in rows.items() if not files]


def test_every_folder_has_a_row():
    rows = table_rows()
    missing = [f for f in kernel_folders() if f not in rows]
    assert not missing, f"kernels/ folders without a row in kernels/README.md: {missing}"
    stale = [f for f in rows if not (KERNELS / f).is_dir()]
    assert not stale, f"README rows for folders that do not exist: {stale}"


def test_every_named_file_exists():
    rows = table_rows()
    missing = [str(p.relative_to(ROOT)) for files in rows.values() for p in files
               if not p.is_file()]
    assert not missing, f"kernels/README.md names files that do not exist: {missing}"


def test_every_source_file_is_named():
    named = {p.resolve() for files in table_rows().values() for p in files}
    unnamed = [str(p.relative_to(ROOT)) for p in sorted(KERNELS.rglob("*"))
               if p.suffix in SOURCE_SUFFIXES and p.parent != KERNELS
               and p.resolve() not in named]
    assert not unnamed, f"kernels/ files no row of kernels/README.md names: {unnamed}"


def test_target_attributes_live_in_one_header():
    offenders = [str(p.relative_to(ROOT)) for p in sorted(KERNELS.rglob("*"))
                 if p.suffix in SOURCE_SUFFIXES and p != ISA_HEADER
                 and "__attribute__((target" in p.read_text()]
    assert not offenders, f"target attributes outside {ISA_HEADER.name}: {offenders}"
    defined = re.findall(r'^#define (SNAPSERVE_TARGET_\w+) \\?\s*__attribute__\(\(target\("([^"]+)"\)\)\)',
                         ISA_HEADER.read_text(), re.M)
    assert len(defined) > 10, defined
    sets = [s for _, s in defined]
    assert len(set(sets)) == len(sets), f"a feature set defined twice: {sorted(sets)}"
