"""A model of the lean three-role protocol of sm90_sparse_mla_decode_ws.cuh (kLean, launcher variant 3): the producer
writes tile n's mask into slot n % 3, syncs on the stage's named barrier (kBarEmpty + n % 2: the producer's 128
threads sync, the QK and PV warpgroups' 256 arrive), stores the tile and arrives on `full`; the math warpgroups
arrive on both stage barriers at the start and on tile n's after PV(n) while n + 2 < count; QK and PV hand P over
through two named barriers both sync on. The tile count is even (the kernel pads an odd one).

Random interleavings; checks no deadlock, no party arriving twice in one barrier generation (the hardware would
count it towards the same one), no barrier left with arrivals at the end, every mask and stage read fresh (not yet
overwritten by tile n + 3 / n + 2) and complete, and that a slot or stage is rewritten only once every read of
its older tile is done. `bug` injects a fault the model must catch (tests/test_mla_lean_protocol_model.py).

    python tools/model_mla_lean_protocol.py      # counts 0-20, 300 interleavings each
"""

from __future__ import annotations

import random


class MBar:
    """An mbarrier with `count` arrivals a phase (the producer's 128 threads are one agent here)."""

    def __init__(self, count: int):
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def done(self, parity: int) -> bool:  # try_wait.parity
        return (self.phase & 1) != parity


class NamedBar:
    """bar.sync / bar.arrive over fixed parties: a generation completes when every party has arrived or synced."""

    def __init__(self, parties: set[str]):
        self.parties, self.arrived, self.gen = parties, set(), 0

    def arrive(self, who: str) -> None:
        assert who not in self.arrived, ("arrived twice in one generation", who, self.gen)
        self.arrived.add(who)
        if self.arrived == self.parties:
            self.arrived, self.gen = set(), self.gen + 1

    def sync(self, who: str, state: dict) -> bool:
        """One step of a blocking sync: registers `who` once, then is done when the generation it joined has
        completed."""
        if "gen" not in state:
            state["gen"] = self.gen
            self.arrive(who)
        return self.gen > state["gen"]


def run_interleaved(rnd: random.Random, agents: list, deadlock: tuple) -> None:
    """Steps randomly chosen agents (generators yielding whether they progressed) until all finish; a long run of
    steps without progress is a deadlock (reported with `deadlock`)."""
    live, stalled = list(agents), 0
    while live:
        a = rnd.choice(live)
        try:
            progressed = next(a)
        except StopIteration:
            live.remove(a)
            stalled = 0
            continue
        stalled = 0 if progressed else stalled + 1
        assert stalled < 10_000, deadlock


def simulate(count: int, seed: int, bug: str = "") -> None:
    """One random interleaving of a CTA of `count` tiles. `bug`: "no_wait" (the producer skips the stage-free
    sync), "early_release" (the QK warpgroup releases tile n's stage before its PV(n) is done), "one_mask_slot"
    (the mask ring has 1 slot, not 3)."""
    assert count % 2 == 0
    slots = 1 if bug == "one_mask_slot" else 3
    rnd = random.Random(seed)
    full = [MBar(1), MBar(1)]
    empty = [NamedBar({"P", "QK", "PV"}) for _ in range(2)]
    p_ready = NamedBar({"QK", "PV"})
    p_free = NamedBar({"QK", "PV"})
    mask = [None] * slots         # slot -> tile whose mask it holds
    stage = [None, None]          # stage -> tile stored there
    softmax_done = -1             # last tile whose mask the QK warpgroup has read
    reads_done = {"QK": [-1, -1], "PV": -1}  # QK: last QK(n) read, last PV(n) read; PV: last PV(n) read

    def check_stage_free(n: int) -> None:
        old = n - 2
        assert reads_done["QK"][0] >= old and reads_done["QK"][1] >= old and reads_done["PV"] >= old, (
            "stage rewritten before its older tile's reads", n, reads_done)

    def producer():
        for n in range(count):
            st = n & 1
            assert softmax_done >= n - slots, ("mask slot rewritten before it was read", n, softmax_done)
            mask[n % slots] = n
            yield True
            state = {}
            while bug != "no_wait" and not empty[st].sync("P", state):
                yield False
            check_stage_free(n)
            stage[st] = n
            yield True
            full[st].arrive()
            yield True

    def wait_full(n):
        while not full[n & 1].done((n >> 1) & 1):
            yield False

    def sync(bar, who):
        state = {}
        while not bar.sync(who, state):
            yield False

    def release(who, n):
        if n + 2 < count:
            empty[n & 1].arrive(who)

    def read_stage(who, n, kind):
        assert stage[n & 1] == n, ("stale or incomplete stage", who, kind, n, stage)
        if who == "QK":
            reads_done["QK"][0 if kind == "qk" else 1] = n
        else:
            reads_done["PV"] = n

    def qk():
        nonlocal softmax_done
        if count > 0:
            empty[0].arrive("QK")
            empty[1].arrive("QK")
            yield True
            yield from wait_full(0)
            read_stage("QK", 0, "qk")
            assert mask[0] == 0, ("mask", 0, mask)
            softmax_done = 0
            yield True
            yield from sync(p_ready, "QK")
        for n in range(count - 1):  # PV(n) issued, tile n + 1's stage waited for, QK^T(n + 1) issued
            yield from wait_full(n + 1)
            if bug == "early_release":
                release("QK", n)
                yield True
            read_stage("QK", n, "pv")  # PV(n) completes
            yield True
            if bug != "early_release":
                release("QK", n)
            read_stage("QK", n + 1, "qk")  # QK(n + 1) completes before the softmax
            yield True
            assert mask[(n + 1) % slots] == n + 1, ("mask", n + 1, mask)
            softmax_done = n + 1
            yield from sync(p_free, "QK")
            yield from sync(p_ready, "QK")  # publish_p: P(n + 1)
        if count > 0:
            read_stage("QK", count - 1, "pv")
            release("QK", count - 1)
            yield True
            yield from sync(p_free, "QK")
        yield from sync(p_ready, "QK")

    def pv():
        if count > 0:
            empty[0].arrive("PV")
            empty[1].arrive("PV")
            yield True
        for n in range(count):
            yield from wait_full(n)
            yield from sync(p_ready, "PV")
            read_stage("PV", n, "pv")
            yield True
            release("PV", n)
            yield from sync(p_free, "PV")
        yield from sync(p_ready, "PV")

    run_interleaved(rnd, [producer(), qk(), pv()], ("deadlock", count, seed, stage, mask, reads_done))
    for bar in empty + [p_ready, p_free]:  # nothing left half-arrived when the CTA exits
        assert not bar.arrived, ("barrier left with arrivals", count, seed, bar.arrived)


def main() -> int:
    for count in range(0, 22, 2):
        for seed in range(300):
            simulate(count, seed)
    print("lean protocol model (variant 3): ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
