"""A load run's phases (probes/load.py has the whole design): the closed loop (requests or tasks), the
open loop, the replay of a workload file, and each phase's start, outside stop and end-of-phase
bookkeeping."""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Coroutine, Iterator
from typing import Any

from diagnose.capture.workload import Phase, Replay
from diagnose.probes.load_pacing import _cancel_all, _gap_fn, _Quota, _run_workers, _spawn
from diagnose.probes.load_records import ReplayItem
from diagnose.probes.load_requests import _RunRequests
from diagnose.probes.prompts import Prompt
from diagnose.probes.sessions import Conversation, TaskPlan, Turn, run_task
from diagnose.probes.sse import StreamResult, now_ns, sleep_until

STOP_GRACE_S = 5.0  # after an outside stop, in-flight requests get this long before being cancelled


class _RunPhases(_RunRequests):
    """How a load run drives its phases (the workload's shape) over the requests it sends."""

    # -- phases ---------------------------------------------------------------------------------
    def _over(self, deadline: int | None) -> bool:
        """The capture is stopping or the phase's deadline has passed."""
        return self.stopping or (deadline is not None and now_ns() >= deadline)

    def _num_requests(self, ph: Phase) -> int | None:
        return ph.num_requests if ph.num_requests is not None else self.spec.num_requests

    async def _closed(self, ph: Phase, deadline: int | None) -> None:
        if self.spec.turns > 1 and ph.role != "baseline":
            await self._tasks(ph, deadline)
            return
        if self.dataset is not None and ph.role != "baseline":
            await self._dataset_closed(ph, deadline)
            return
        quota = _Quota(self.spec.warmup_requests, self._num_requests(ph))

        async def worker() -> None:
            prev: int | None = None  # a worker's first send follows no completion: no schedule lag for it
            while not self._over(deadline):
                warm = quota.take()
                if warm is None:
                    return
                if await self._hold():
                    prev = None  # a pause the server asked for is no schedule lag of the client
                    if self._over(deadline):
                        return
                res = await self._one(ph.index, warm, prev)
                prev = res.end_ns or now_ns()

        await _run_workers(worker, max(1, ph.concurrency or 1))

    async def _tasks(self, ph: Phase, deadline: int | None) -> None:
        """A closed loop of tasks (``--turns``; probes/sessions.py): each worker runs one task at a time, its
        next task when the last answer of the previous one arrives. ``--warmup`` and ``--num-requests`` count
        tasks here."""
        plan = TaskPlan(self.spec.turns, self.spec.think_time_s, self.spec.retries)
        quota = _Quota(self.spec.warmup_requests, self._num_requests(ph))
        n_task = 0

        def over() -> bool:
            return self._over(deadline)

        def new_prompt() -> Prompt:
            self.seq += 1  # the new user text's number (kept apart from the request numbers _one takes)
            drawn = self.next_input()
            if drawn is None:
                return self.prompts.make(1_000_000 + self.seq)
            return self.prompts.make_sized(1_000_000 + self.seq, drawn)

        async def send(warm: bool, due: int | None, turn: Turn) -> StreamResult:
            if await self._hold():
                due = None  # a pause the server asked for is no schedule lag of the client
            return await self._one(ph.index, warm, due, turn=turn)

        async def worker() -> None:
            nonlocal n_task
            due: int | None = None
            while not over():
                warm = quota.take()
                if warm is None:
                    return
                n_task += 1
                conv = Conversation(self.prompts, f"{self.token}-t{ph.index}-{n_task}", plan.turns, self.spec.seed)
                due = await run_task(plan, conv, warm, due, send, new_prompt, over, now_ns)
                if due is None:
                    return

        await _run_workers(worker, max(1, ph.concurrency or 1))

    async def _open(self, ph: Phase, start: int, deadline: int | None) -> None:
        rate = float(ph.rate or 1.0)
        gap = _gap_fn(self.spec, rate, random.Random(f"{self.spec.seed}-{ph.index}"))
        sem = asyncio.Semaphore(ph.max_concurrency) if ph.max_concurrency else None
        tasks: set[asyncio.Task[Any]] = set()
        n = self._num_requests(ph)
        total = None if n is None else n + self.spec.warmup_requests

        async def capped_one(warm: bool, intended: int) -> None:
            assert sem is not None
            capped = sem.locked()
            async with sem:
                await self._one(ph.index, warm, intended, capped)

        t_next = float(start)
        i = 0
        try:
            while not self.stopping and (total is None or i < total):
                t_next += gap() * 1e9
                if deadline is not None and t_next >= deadline:
                    break
                if self.hold_until_ns > t_next:  # Retry-After: the arrivals it covers are not sent
                    await self._hold()
                    t_next = max(t_next, float(now_ns()))
                    if self.stopping:
                        break
                    continue
                if await sleep_until(int(t_next), lambda: self.stopping):
                    break
                warm = i < self.spec.warmup_requests
                coro: Coroutine[Any, Any, Any]
                if self.dataset is not None:  # a conversation arrives: its turns follow its answers
                    coro = self._conversation(ph, warm, int(t_next), deadline, sem)
                else:
                    coro = capped_one(warm, int(t_next)) if sem else self._one(ph.index, warm, int(t_next))
                _spawn(tasks, coro)
                i += 1
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            await _cancel_all(tasks)

    # -- a dataset (--dataset): each record a conversation, its turns sent one after the other's answer ----
    async def _dataset_closed(self, ph: Phase, deadline: int | None) -> None:
        """A closed loop of conversations: each worker sends one conversation's turns, each when the previous
        answer has arrived, then the next conversation. ``--warmup`` and ``--num-requests`` count records."""
        quota = _Quota(self.spec.warmup_requests, self._num_requests(ph))

        async def worker() -> None:
            due: int | None = None
            while not self._over(deadline):
                warm = quota.take()
                if warm is None:
                    return
                if await self._hold():
                    due = None  # a pause the server asked for is no schedule lag of the client
                due = await self._conversation(ph, warm, due, deadline)
                if due is None:
                    return

        await _run_workers(worker, max(1, ph.concurrency or 1))

    async def _conversation(self, ph: Phase, warm: bool, intended: int | None, deadline: int | None,
                            sem: asyncio.Semaphore | None = None) -> int | None:
        """The next record's turns in order (the records taken in file order, from the first again when all were
        sent). Returns when the last answer ended; None when the phase ended or a turn failed meanwhile."""
        assert self.dataset is not None
        convs = self.dataset.ds.conversations
        n = self.n_conv
        self.n_conv += 1
        conv, n_pass = convs[n % len(convs)], n // len(convs)
        chat = self.spec.api == "chat"
        session = f"{self.token}-d{n}" if len(conv.turns) > 1 else ""
        due = intended
        end: int | None = None
        for j in range(len(conv.turns)):
            if j and self._over(deadline):  # the phase ended: the conversation is cut, not finished late
                return None
            key = (conv.index, j)
            msgs = conv.messages(j) if chat else []
            text = conv.prompt(j)  # the chat API sends msgs; the record's text (--store-text) is the whole
            out = self.dataset.answer.get(key) or conv.output_tokens or self.next_output()
            turn = Turn(session, j, len(conv.turns), 0,
                        Prompt(text=text, tokens=self.dataset.prompt[key],
                               source="tokenize" if key in self.dataset.exact else "estimate"),
                        tuple(msgs), max_tokens=out,
                        fields=(("dataset_index", conv.index), ("dataset_pass", n_pass)))
            if sem is not None:
                capped = sem.locked()
                async with sem:
                    res = await self._one(ph.index, warm, due, capped, turn=turn)
            else:
                res = await self._one(ph.index, warm, due, turn=turn)
            end = res.end_ns or now_ns()
            due = end
            if res.error is not None:
                return end if not self.stopping else None
        return end

    async def _replay(self, ph: Phase, rp: Replay, start: int, deadline: int | None) -> None:
        """Sends each request of the workload file at its recorded offset (divided by ``speed``), ``loop``
        times over (a loop starts one period after the previous one, ``Replay.period_s``), optionally capped
        at ``max_concurrency`` in flight (a request that waits for the cap is marked ``capped``). A
        Retry-After pause delays the requests it covers (their schedule lag shows it); none is dropped. With
        ``session_wait`` a session's turn is not sent before the previous turn of its session has ended."""
        sem = asyncio.Semaphore(ph.max_concurrency) if ph.max_concurrency else None
        tasks: set[asyncio.Task[Any]] = set()
        cap = self._num_requests(ph)
        period = rp.period_s()
        # a conversation: a session's turn is sent at its offset, but never before the previous turn's answer
        # has ended (--no-session-wait: at its offset regardless). Each turn resolves a future with the time
        # its answer ended, which its next turn awaits; a turn that waited is due then (its schedule lag
        # starts there).
        answered: dict[tuple[int, str], asyncio.Future[int]] = {}

        async def one(warm: bool, intended: int, item: ReplayItem) -> None:
            if sem is None:
                await self._one(ph.index, warm, intended, False, item)
                return
            capped = sem.locked()
            async with sem:
                if deadline is not None and now_ns() >= deadline:  # --duration is wall time: not sent
                    return
                await self._one(ph.index, warm, intended, capped, item)

        async def turn(warm: bool, intended: int, item: ReplayItem, prev: asyncio.Future[int] | None,
                       mine: asyncio.Future[int]) -> None:
            try:
                if prev is not None and (ended := await asyncio.shield(prev)) > intended:
                    intended = ended
                    if deadline is not None and intended >= deadline:  # --duration is wall time: not sent
                        return
                    if await sleep_until(intended, lambda: self.stopping):
                        return
                await one(warm, intended, item)
            finally:
                if not mine.done():
                    mine.set_result(now_ns())

        def plan() -> Iterator[tuple[ReplayItem, int]]:  # (the request, when it is due: ns, monotonic)
            for lp in range(rp.loop):
                for idx, req in enumerate(rp.requests):
                    yield (idx, lp, req), start + int((lp * period + req.offset_s) / rp.speed * 1e9)

        i = 0
        seq0 = self.seq
        try:
            for item, t in plan():
                if self.stopping or (cap is not None and i >= cap) or (deadline is not None and t >= deadline):
                    break
                if self.hold_until_ns > t:
                    await self._hold()
                    if self.stopping:
                        break
                if await sleep_until(t, lambda: self.stopping):
                    break
                warm = i < self.spec.warmup_requests
                session = item[2].session
                if session is not None and self.spec.session_wait:
                    key = (item[1], session)
                    prev = answered.get(key)
                    answered[key] = mine = asyncio.get_running_loop().create_future()
                    _spawn(tasks, turn(warm, t, item, prev, mine))
                else:
                    _spawn(tasks, one(warm, t, item))
                i += 1
            if tasks and deadline is not None:  # --duration is wall time: what is in flight at its end gets the
                # grace an outside stop gives, then is cancelled (recorded incomplete, with this reason)
                done, late = await asyncio.wait(set(tasks), timeout=max(0, deadline - now_ns()) / 1e9 + STOP_GRACE_S)
                await asyncio.gather(*done)  # an error of a finished one surfaces as before
                if late:
                    self.cut_reason = (f"the replay's --duration ended while the request was in flight (cut "
                                       f"{STOP_GRACE_S:g} s later)")
            elif tasks:
                await asyncio.gather(*tasks)
        finally:
            await _cancel_all(tasks)
            self.cut_reason = ""
            # due before the end but never sent: held by --max-concurrency or a session's wait past --duration
            self.notes["replay_unsent"] = self.notes.get("replay_unsent", 0) + i - (self.seq - seq0)

    async def _phase(self, ph: Phase, rec: dict[str, Any]) -> None:
        start = now_ns()
        rec["start_ns"] = start
        dur = ph.duration_s if ph.duration_s is not None else self.spec.duration_s
        if ph.duration_s is None and self._num_requests(ph) is not None:
            dur = None  # a request count bounds the phase
        deadline = start + int(dur * 1e9) if dur else None
        self.stats.phase_label = ph.name
        self.stats.phase_end_s = None if deadline is None else deadline / 1e9
        if self.spec.replay is not None and ph.role != "baseline":
            await self._replay(ph, self.spec.replay, start, deadline)
        elif ph.rate is not None:
            await self._open(ph, start, deadline)
        else:
            await self._closed(ph, deadline)

    async def _run_phase(self, ph: Phase) -> bool:
        """Runs one phase; returns False when the capture was stopped from outside during it."""
        seq0 = self.seq
        mode = ("replay" if self.spec.replay is not None and ph.role != "baseline"
                else "rate" if ph.rate else "concurrency")
        rec: dict[str, Any] = {"phase": ph.index, "name": ph.name, "mode": mode,
                               "concurrency": ph.concurrency, "rate": ph.rate, "max_concurrency": ph.max_concurrency,
                               "role": ph.role, "repeat": ph.repeat, "arrival": self.spec.arrival, "burstiness": self.spec.burstiness,
                               "start_ns": now_ns(), "end_ns": None, "warmup_requests": self.spec.warmup_requests}
        task = asyncio.ensure_future(self._phase(ph, rec))
        stop_wait = asyncio.ensure_future(self.ctx.stop.wait())
        outside = False
        try:
            await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                outside = True
                self.stopping = True
                await asyncio.wait({task}, timeout=STOP_GRACE_S)
                if not task.done():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            elif task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        finally:
            stop_wait.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            rec["end_ns"] = now_ns()
            rec["requests"] = self.seq - seq0
            rec["interrupted"] = outside or not task.done() or task.cancelled()
            self.ctx.shared.setdefault("phases", []).append(rec)
            await self._phase_end(rec)
        return not outside

    async def _phase_end(self, rec: dict[str, Any]) -> None:
        """End-of-phase bookkeeping, with no request of the phase in flight: the phase's records are
        serialised a slice per loop turn (the I/O thread writes them; nothing here waits for the disk), then
        the collector's oldest generation runs over what the phase left (set-up objects stay frozen, so it
        scans only those) and the survivors are frozen too."""
        await self.drain()
        self._write(self.w_phases, [rec])
        if self._gc_deferred:
            t0 = time.perf_counter_ns()
            gc.collect()
            gc.freeze()
            self.monitor.note("phase_end", (time.perf_counter_ns() - t0) / 1e6)
