"""CPU model of the top-k kernels' page-table mapping (RowOut::map in
backends_cuda/include/dsa_cuda/common_topk_row.cuh): the 32-bit form the kernels use gives the same
physical slot as the exact 64-bit definition, -1 included, on random and edge inputs."""

import random

INT32_MAX = 2**31 - 1


def exact(rel, first, slots, log2_page, page):
    """The contract: page_table[b, first + rel // P] * P + rel % P, or -1 (rel < 0, slot outside the
    table, negative page, or a result past int32)."""
    if rel < 0:
        return -1
    slot = first + (rel >> log2_page)
    if not 0 <= slot < slots or page < 0:
        return -1
    phys = (page << log2_page) + (rel & ((1 << log2_page) - 1))
    return -1 if phys > INT32_MAX else phys


def kernel_form(rel, first, slots, log2_page, page):
    """RowOut::map: the slot check in 64 bits, then one unsigned compare and 32-bit arithmetic."""
    if rel < 0:
        return -1
    slot = first + (rel >> log2_page)
    if not 0 <= slot < slots:
        return -1
    if (page & 0xFFFFFFFF) > (INT32_MAX >> log2_page):
        return -1
    v = ((page << log2_page) & 0xFFFFFFFF) | (rel & ((1 << log2_page) - 1))
    return v - 2**32 if v > INT32_MAX else v


def test_page_map_32_bit_form_is_exact():
    rnd = random.Random(0)
    pages = [-(2**31), -1, 0, 1, 2, 2**15, 2**24 - 1, 2**24, 2**25, INT32_MAX]
    firsts = [-(2**31), -5, -1, 0, 1, 7, INT32_MAX]
    slot_counts = [0, 1, 2, 5, 2**20, INT32_MAX, 2**31, 2**40]
    for _ in range(100_000):
        log2_page = rnd.choice([0, 1, 6, 16, 30, 31, rnd.randrange(32)])  # page sizes 1 .. 2^31
        rel = rnd.choice([-1, 0, 1, 63, 64, INT32_MAX, rnd.randrange(-10, 2**31)])
        first = rnd.choice(firsts + [rnd.randrange(-(2**31), 2**31)])
        slots = rnd.choice(slot_counts + [rnd.randrange(0, 2**34)])
        page = rnd.choice(pages + [rnd.randrange(-(2**31), 2**31)])
        args = (rel, first, slots, log2_page, page)
        assert kernel_form(*args) == exact(*args), args
    # Every page at the int32 edge for each page size: the largest that fits maps, the next does not.
    for log2_page in range(32):
        top = INT32_MAX >> log2_page
        mask = (1 << log2_page) - 1
        assert kernel_form(mask, 0, 1, log2_page, top) == exact(mask, 0, 1, log2_page, top) >= 0
        if top < INT32_MAX:
            assert kernel_form(0, 0, 1, log2_page, top + 1) == exact(0, 0, 1, log2_page, top + 1) == -1
