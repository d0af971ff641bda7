"""A model of one warp of the persistent sparse_attention kernel (smxx_sparse_attention.cuh): the lookahead
registers, the ring and the unit switch, every load a tag (unit, local step), each use checked against what it needs.

Every unit of a CTA gives the warp the same n steps (a CTA takes several units only with one split and at least
kMultiUnitMinSteps steps, so n >= kStages + 3). The last check shows that shorter units break the pipeline once a
CTA takes three, so the model can fail.

    python3 tools/model_sa_persistent_pipeline.py
"""
import itertools

K_STAGES = 3

def run(n, units):
    # units: list of unit ids this CTA takes; every unit gives this warp n steps (multi-unit: n >= 6).
    cur = 0
    has_next = len(units) > 1
    def owner(j, cur):  # virtual step j (from the current unit's start) -> (unit index, local step) or None
        if j < n:
            return (cur, j)
        jn = j - n
        if cur + 1 < len(units) and jn < n:
            return (cur + 1, jn)
        return None
    pos = [owner(j, cur) for j in range(K_STAGES + 3)]
    page = [pos[j] for j in range(K_STAGES + 1)]  # page of a position: same tag (bt row of its owner)
    ring = [None] * K_STAGES
    inflight = set()
    issued = []
    def issue(stage, tag, zfill):
        ring[stage] = tag
        inflight.add(stage)
        issued.append((tag, zfill))
    for j in range(K_STAGES - 1):
        issue(j, page[j], True)
    page1, page2, pos3, pos4 = page[K_STAGES - 1], page[K_STAGES], pos[K_STAGES + 1], pos[K_STAGES + 2]
    stage, issue_stage = 0, K_STAGES - 1
    consumed = []
    while True:
        for j in range(n):
            # h used by row_ptr: j + 2 < n ? h : nh  -> owner unit of step j+2 must match page1's tag
            want = owner(j + K_STAGES - 1, cur)
            assert page1 == want, (cur, j, page1, want)
            zfill = j == 0 or j + K_STAGES - 1 >= n
            if want is not None:
                assert zfill == (want[1] < K_STAGES) or (want[1] >= K_STAGES and not zfill), (cur, j, want, zfill)
                if want[1] < K_STAGES:
                    assert zfill, ("first steps of a unit must zero-fill", cur, j, want)
            issue(issue_stage, page1, zfill)
            issue_stage = 0 if issue_stage + 1 == K_STAGES else issue_stage + 1
            page1 = page2
            # load_page(j + kStages + 1 < n ? bt_row : nbt_row, pos3): pos3 must be step j + 4's position
            assert pos3 == owner(j + K_STAGES + 1, cur), (cur, j, pos3)
            page2 = pos3
            pos3 = pos4
            pos4 = owner(j + K_STAGES + 3, cur)
            # wait<kStages - 1>: the group of step j is complete
            assert ring[stage] == (cur, j), (cur, j, stage, ring)
            inflight.discard(stage)
            consumed.append(ring[stage])
            stage = 0 if stage + 1 == K_STAGES else stage + 1
        free = K_STAGES - 1 if stage == 0 else stage - 1
        # the free stage holds no copy in flight (n >= 1: step n - 1's, consumed; n == 0: never issued)
        assert free not in inflight or (n == 0 and ring[free] is None), (cur, free, inflight)
        if not has_next:
            break
        cur += 1
        has_next = cur + 1 < len(units)
    assert consumed == [(u, j) for u in range(len(units)) for j in range(n)], consumed
    return issued

MIN_N = K_STAGES + 3


def main() -> None:
    for n, nu in itertools.product(range(MIN_N, 40), range(1, 5)):
        run(n, list(range(nu)))
    for n in range(0, MIN_N):  # single unit a CTA: any n
        run(n, [0])
    for n in range(1, MIN_N):  # fault injection: units below the launcher's minimum, three a CTA
        try:
            run(n, [0, 1, 2])
        except AssertionError:
            continue
        raise SystemExit(f"three units of {n} steps were not caught")
    print("pipeline model: ok")


if __name__ == "__main__":
    main()
