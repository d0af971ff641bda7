"""A model of the lean three-role protocol of sm90_sparse_mla_decode_ws.cuh (kLean, launcher variant 3): the producer
writes tile n's mask into slot n % 3, syncs on the stage's named barrier (kBarEmpty + n % 2: the producer's 128
threads sync, the QK and PV warpgroups' 256 arrive), stores the tile and arrives on `full`; the math warpgroups
arrive on both stage barriers at the start and on tile n's after PV(n) while n + 2 < count; QK and PV hand P over
through two named barriers both sync on. The tile count is even (the kernel pads an odd one).

Random interleavings; checks no deadlock, no party arriving twice in one barrier generation (the hardware would
count it towards the same one), no barrier left with arrivals at the end, every mask and stage read fresh (not yet
overwritten by tile n + 3 / n + 2) and complete, and that a slot or stage is rewritten only once every read of
its older tile is done.

simulate_pair models variant 4 (the same in a cluster of two CTAs, each producer storing its half of every tile
into both CTAs' stages, the stage-free wait an mbarrier that both math warpgroups of both CTAs arrive on once
their PV(n) is done; the kernel's 16 arrivals, one a math warp, are one a warpgroup here).

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


def simulate(count: int, seed: int) -> None:
    assert count % 2 == 0
    rnd = random.Random(seed)
    full = [MBar(1), MBar(1)]
    empty = [NamedBar({"P", "QK", "PV"}) for _ in range(2)]
    p_ready = NamedBar({"QK", "PV"})
    p_free = NamedBar({"QK", "PV"})
    mask = [None, None, None]     # slot -> tile whose mask it holds
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
            assert softmax_done >= n - 3, ("mask slot rewritten before it was read", n, softmax_done)
            mask[n % 3] = n
            yield True
            state = {}
            while not empty[st].sync("P", state):
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
            read_stage("QK", n, "pv")  # PV(n) completes
            yield True
            release("QK", n)
            read_stage("QK", n + 1, "qk")  # QK(n + 1) completes before the softmax
            yield True
            assert mask[(n + 1) % 3] == n + 1, ("mask", n + 1, mask)
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


def simulate_pair(count: int, seed: int, bug: str = "") -> None:
    """Variant 4: two CTAs (0, 1) of a cluster. Producer r stores half r of tile n into both CTAs' stage n % 2
    after waiting its own `empty` (4 arrivals: the QK and the PV warpgroup of each CTA, each once its PV(n - 2) is
    done), and completes `full` in both (its own arrival here; the bytes there). Each producer writes its own CTA's
    mask ring. `bug` injects a fault the model must catch: "no_wait" (no empty wait), "early_release" (the QK
    warpgroup's release before its PV(n) is done), "own_release" (a warpgroup releases only its own CTA's stage)."""
    assert count % 2 == 0
    rnd = random.Random(seed)
    full = [[MBar(2), MBar(2)] for _ in range(2)]    # [cta][stage]: own producer's arrival + the peer's bytes
    empty = [[MBar(4), MBar(4)] for _ in range(2)]   # [cta][stage]: QK and PV of each CTA
    p_ready = [NamedBar({"QK", "PV"}) for _ in range(2)]
    p_free = [NamedBar({"QK", "PV"}) for _ in range(2)]
    mask = [[None] * 3 for _ in range(2)]
    stage = [[[None, None], [None, None]] for _ in range(2)]  # [cta][stage][half] -> tile
    softmax_done = [-1, -1]
    reads_done = [{"qk": -1, "pv_qk": -1, "pv": -1} for _ in range(2)]

    def producer(r):
        for n in range(count):
            st = n & 1
            assert softmax_done[r] >= n - 3, ("mask slot rewritten before it was read", r, n, softmax_done)
            mask[r][n % 3] = n
            yield True
            if bug != "no_wait":
                while not empty[r][st].done(((n >> 1) & 1) ^ 1):
                    yield False
            for c in (0, 1):  # own stage (st.shared) and the peer's (st.async)
                rd = reads_done[c]
                assert min(rd.values()) >= n - 2, ("stage rewritten before its older tile's reads", r, c, n, rd)
                stage[c][st][r] = n
                yield True
            for c in (r, r ^ 1):  # own arrival; the peer's complete-tx of this producer's bytes
                full[c][st].arrive()
                yield True

    def wait_full(c, n):
        while not full[c][n & 1].done((n >> 1) & 1):
            yield False

    def sync(bar, who):
        state = {}
        while not bar.sync(who, state):
            yield False

    def read_stage(c, n, kind):
        assert stage[c][n & 1] == [n, n], ("stale or incomplete stage", c, kind, n, stage[c])
        reads_done[c][kind] = n

    def release(c, n):
        if n + 2 < count:
            for t in ((c,) if bug == "own_release" else (c, c ^ 1)):
                empty[t][n & 1].arrive()

    def qk(c):
        if count > 0:
            yield from wait_full(c, 0)
            read_stage(c, 0, "qk")
            assert mask[c][0] == 0, ("mask", c, 0, mask[c])
            softmax_done[c] = 0
            yield True
            yield from sync(p_ready[c], "QK")
        for n in range(count - 1):  # PV(n) issued, tile n + 1's stage waited for, QK^T(n + 1) issued
            yield from wait_full(c, n + 1)
            if bug == "early_release":
                release(c, n)
                yield True
            read_stage(c, n, "pv_qk")  # PV(n) completes
            yield True
            if bug != "early_release":
                release(c, n)
            read_stage(c, n + 1, "qk")
            yield True
            assert mask[c][(n + 1) % 3] == n + 1, ("mask", c, n + 1, mask[c])
            softmax_done[c] = n + 1
            yield from sync(p_free[c], "QK")
            yield from sync(p_ready[c], "QK")
        if count > 0:
            read_stage(c, count - 1, "pv_qk")
            yield True
            yield from sync(p_free[c], "QK")
        yield from sync(p_ready[c], "QK")

    def pv(c):
        for n in range(count):
            yield from wait_full(c, n)
            yield from sync(p_ready[c], "PV")
            read_stage(c, n, "pv")
            yield True
            release(c, n)
            yield from sync(p_free[c], "PV")
        yield from sync(p_ready[c], "PV")

    run_interleaved(rnd, [producer(0), producer(1), qk(0), qk(1), pv(0), pv(1)],
                    ("deadlock", count, seed, stage, mask, reads_done))
    for c in (0, 1):
        for bar in (p_ready[c], p_free[c]):
            assert not bar.arrived, ("barrier left with arrivals", count, seed, bar.arrived)


def main() -> int:
    for count in range(0, 22, 2):
        for seed in range(300):
            simulate(count, seed)
            simulate_pair(count, seed)
    print("lean protocol model (variant 3 and its pairs): ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
