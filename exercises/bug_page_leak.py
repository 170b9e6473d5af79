"""Find the bug: a page never returned.

broken_serve() is a continuous batcher over a paged KV cache, in plain Python, the
bookkeeping of sessions/serve/ without the model: a pool of `pages` pages of page_size
(N) tokens, a free list, a page table a request (its pages, in order) and `slots`
rows. Each step it admits waiting requests into free rows, first come, first served;
each running request takes a page from the free list when its next token starts one
(and waits, making nothing, while none is free), then makes one token; a request
that holds its `length` tokens finishes and gives its pages back.

The pool holds every row's longest request at once, so no row should ever wait. Yet
on a long enough stream rows wait for pages that never come, and the run stops with
requests unfinished (vLLM would preempt them, again and again). Its first tests
passed: they used lengths of 16, 32 and 64 tokens in pages of 16.

The tool: an invariant of the allocator, checked after every step and after
draining: every page is in exactly one place, the free list or one page table. When
nothing runs and nothing waits, every page is free (pages_free == pages_total).
"""

import collections


def broken_serve(lengths, slots, pages, page_size):
    """Serve requests of lengths[i] tokens (i the request's id) on `slots` rows from a
    pool of `pages` pages: (steps, finished ids in finishing order, the free list, the
    page tables of requests still running) when nothing is left to do or nothing can
    move. Steps count those that made a token."""
    free = list(range(pages))  # pop() hands out the list's last page
    waiting = collections.deque(range(len(lengths)))
    tables, held = {}, {}  # a running request's pages, and the tokens it holds
    finished, steps = [], 0
    while waiting or tables:
        while waiting and len(tables) < slots:  # admit, first come, first served
            request = waiting.popleft()
            tables[request], held[request] = [], 0
        made = 0
        for request in tables:
            if held[request] % page_size == 0:  # its next token starts a page
                if not free:
                    continue  # none free: this row waits a step
                tables[request].append(free.pop())
            held[request] += 1
            made += 1
        if made == 0:
            break  # every row waits for a page, and none will come back
        steps += 1
        for request in [r for r in tables if held[r] == lengths[r]]:
            pages_used = held.pop(request) // page_size
            free.extend(tables.pop(request)[:pages_used])
            finished.append(request)
    return steps, finished, free, tables


def serve(lengths, slots, pages, page_size):
    """broken_serve, fixed: the same schedule and the same return, every page of a
    finished request back on the free list.
    Hint: how many pages does a request of 5 tokens hold, in pages of 4?"""
    raise NotImplementedError


def leaked_pages(pages, free, tables):
    """The allocator's invariant as a check: the pages of a pool of `pages` (ids 0 to
    pages - 1) that are neither on the free list nor in any page table (tables: request
    -> its pages), sorted. Hint: sets; what is left of range(pages)?"""
    raise NotImplementedError
