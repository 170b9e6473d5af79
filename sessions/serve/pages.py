"""The page pool: the KV cache handed out in pages of N tokens, on the host.

A cache that reserves every sequence's longest possible context (cfg.seq tokens) holds
few sequences, most of it empty; vLLM (arXiv 2309.06180) measured 20.4-38.2% of such
systems' KV memory holding tokens, and under 4% wasted once it is handed out in blocks
of 16 tokens as a sequence grows. A sequence holds a page table, the pages it was given
in order: its token at position p lies in page table[p // N], at offset p % N.

This is the bookkeeping alone, pure Python, as MaxText's page_manager.py keeps it: a
free list, and allocation all or nothing (a request is given every page it asks for, or
none, so a half-admitted request never holds pages it cannot use). The device's pool
(sessions/serve/paged_cache.py) has one page more, index `pages`, the padding page: a
page table's unused entries point at it, it is never allocated, never written, and
counted in neither `total` nor `free`.
"""

import math

from sessions.errors import UsageError


def pages_for(tokens, page_size):
    """The pages that hold `tokens` tokens: ceil(tokens / N)."""
    return math.ceil(tokens / page_size)


class PagePool:
    """`pages` allocatable pages of `page_size` tokens, and a free list."""

    def __init__(self, pages, page_size):
        if pages < 1 or page_size < 1:
            raise UsageError(
                f"a pool needs pages >= 1 and page_size >= 1, not {pages}, {page_size}"
            )
        self.total, self.page_size = pages, page_size
        self.padding = pages  # the device pool's extra page (see above)
        # Popped from the end: page 0 is handed out first, so a run reads in page order.
        self._free = list(range(pages - 1, -1, -1))
        self._held = set()  # allocated pages: a page released twice is a bug, caught

    @property
    def free(self):
        """Pages on the free list."""
        return len(self._free)

    @property
    def used(self):
        return self.total - self.free

    def pages_for(self, tokens):
        """ceil(tokens / N): the pages `tokens` tokens fill."""
        return pages_for(tokens, self.page_size)

    def can_allocate(self, n, keep=0):
        """Whether n pages can be given while `keep` pages stay free (the watermark)."""
        return self.free - n >= keep

    def allocate(self, n, keep=0):
        """n pages off the free list, all of them, or None (and nothing taken) when fewer
        than n + keep are free."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if not self.can_allocate(n, keep):
            return None
        taken = self._free[len(self._free) - n :][::-1]
        del self._free[len(self._free) - n :]
        self._held.update(taken)
        return taken

    def release(self, pages):
        """Pages back onto the free list (a finished, aborted or preempted sequence's)."""
        for page in pages:
            if page not in self._held:
                raise ValueError(f"page {page} is not an allocated page of this pool")
            self._held.remove(page)
        self._free.extend(reversed(pages))
