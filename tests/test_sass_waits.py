"""tools/sass_waits.py on a synthetic cuobjdump listing: control bits decoded, and a wait on a scoreboard shared
by an old and a just-issued load reported with the issue since the newest."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("sass_waits", ROOT / "tools" / "sass_waits.py")
sw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sw)


def _line(addr: int, text: str, stall: int = 1, wb: int = 7, rb: int = 7, wait: int = 0) -> str:
    ctrl = (stall | (wb << 5) | (rb << 8) | (wait << 11)) << 41
    return (f"        /*{addr:04x}*/                   {text} ;          /* 0x000000000000794d */\n"
            f"                                                          /* 0x{ctrl:016x} */\n")


LISTING = (
    _line(0x100, "LDG.E.128.CONSTANT R4, desc[UR4][R2.64]", stall=2, wb=5)
    + _line(0x110, "FMUL R10, R11, R12", stall=4)
    + _line(0x120, "FMUL R10, R11, R12", stall=4)
    + _line(0x130, "LDG.E.128.CONSTANT R8, desc[UR4][R2.64+0x40]", stall=1, wb=5)
    + _line(0x140, "F2FP.F16.E4M3.UNPACK_B R0, R4", stall=1, wait=1 << 5)
    + _line(0x150, "BRA 0x100", stall=5)
)


def test_control_bits_and_shared_scoreboard_wait():
    insns = sw.parse(LISTING)
    assert [x["addr"] for x in insns] == [0x100, 0x110, 0x120, 0x130, 0x140, 0x150]
    assert insns[0]["wb"] == 5 and insns[0]["stall"] == 2 and insns[4]["wait"] == 1 << 5
    assert sw.klass(insns[0]["text"]) == "LDG" and sw.klass(insns[4]["text"]) == "conversion"
    found = sw.waits(sw.body(insns, [(0x100, 0x150)]))
    # The unpack needs the first load only, but the second shares scoreboard 5 and was issued 1 cycle before.
    assert len(found) == 1 and found[0]["addr"] == 0x140
    assert found[0]["loads"] == 2 and found[0]["issue_since_newest"] == 1


def test_main_prints_a_summary(tmp_path, capsys):
    path = tmp_path / "k.sass"
    path.write_text(LISTING)
    assert sw.main([str(path), "100-150"]) == 0
    out = capsys.readouterr().out
    assert "6 instructions, 17 issue cycles" in out and "2 global loads pending" in out
