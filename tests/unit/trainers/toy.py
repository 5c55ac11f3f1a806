"""The toys that show the recipes learn (docs/training.md §3): a tabular ToyRepair with a softmax-tabular policy, trained
by GRPO on BAR or fixed-N groups (§2.3) and by SFT on scripted trajectories with CA-SFT rise segments (§2.2);
all-failed groups scored with a rule-based judge (§2.5); a tiny LM distilled towards a bigram teacher (§2.4).
Shared by tests/unit/trainers/test_learning.py, test_opd.py and bench/learning_proofs.py; no I/O, no download.

Tabular ToyRepair [I]: a task has FILES, one of them buggy. Actions: `ls` (nothing new), `cat <f>` (opens <f>;
opening the buggy file shows the bug), `run_tests` (the failing test names the buggy file), `edit` (edits the open
file: fixes the bug in the buggy file, breaks any other), `submit` (+1 if fixed and nothing broken, else -1).
A rollout not submitted within STEP_BUDGET actions is truncated (-1). The policy sees only (the known buggy file
or none; the open file is none, the known buggy one or another; edited anything): one table row each.

Choices [I]:
- BAR against fixed-N GRPO at the same generation cap per update: 4 prompts with N = 8 of up to N_max = 16
  rollouts, against 8 groups of 8; every group BAR assembles counts, the filter decides what trains.
- Plain SGD on the logits: an update's size then follows its gradient, so fixed-N updates diluted by groups
  without spread are smaller, and that is where BAR gains. With Adam, which rescales every update, fixed-N GRPO
  reaches 60% in fewer environment steps here (bench/learning_proofs.py reports both).
- Success rate and localisation accuracy are exact (a distribution pushed through every world), not sampled.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from trainer_helpers import tiny_lm

from orchard.trainers.bar import BarConfig, Rollout, Status, collect_batch
from orchard.trainers.ca_sft import KeyStep, ca_sample, extract_rise_segments, interpolate
from orchard.trainers.opd import OpdLoss, opd_loss
from orchard.trainers.rl import grpo_advantages, policy_loss
from orchard.trainers.rpr import rpr_advantages
from orchard.trainers.sft import sft_loss, token_logprobs
from orchard.types.v1 import types_pb2 as tpb

# 1. The environment.

FILES = ("a.py", "b.py", "c.py")
ACTIONS = ("ls", *(f"cat {f}" for f in FILES), "run_tests", "edit", "submit")
LS, CAT, RUN_TESTS, EDIT, SUBMIT = 0, 1, 1 + len(FILES), 2 + len(FILES), 3 + len(FILES)
N_ACTIONS, N_STATES = len(ACTIONS), 6 * (len(FILES) + 1)
STEP_BUDGET = 5


@dataclass(frozen=True)
class World:
    """The environment's full state; the policy sees `state_id` of it."""

    buggy: int
    known: int = -1
    """The file the agent knows is buggy (from the failing test or from opening it), -1 if none."""
    open: int = -1
    """The open file, -1 if none."""
    edited: bool = False
    fixed: bool = False
    broken: bool = False


def state_id(w: World) -> int:
    """The policy's view of a world: (known, open file none / the known buggy one / another, edited) as a row."""
    opened = 0 if w.open < 0 else 1 if w.open == w.known else 2
    return ((w.known + 1) * 3 + opened) * 2 + w.edited


def transition(w: World, action: int) -> World:
    """The world after a non-submit action."""
    if CAT <= action < RUN_TESTS:
        opened = action - CAT
        return replace(w, open=opened, known=w.buggy if opened == w.buggy else w.known)
    if action == RUN_TESTS:
        return replace(w, known=w.buggy)
    if action == EDIT and w.open >= 0:
        right = w.open == w.buggy
        return replace(w, edited=True, fixed=w.fixed or right, broken=w.broken or not right)
    return w


# Every world, indexed, with its transitions: the sampler walks these lists and the exact evaluations push a
# probability distribution through them.
WORLDS = [
    World(*v)  # type: ignore[arg-type]  # the product yields ints and bools in World's field order
    for v in itertools.product(range(len(FILES)), range(-1, len(FILES)), range(-1, len(FILES)), *[(False, True)] * 3)
]
_INDEX = {w: i for i, w in enumerate(WORLDS)}
NEXT = [[_INDEX[transition(w, a)] for a in range(N_ACTIONS)] for w in WORLDS]
STATE = [state_id(w) for w in WORLDS]
START = [_INDEX[World(b)] for b in range(len(FILES))]
_NEXT, _STATE = torch.tensor(NEXT).flatten(), torch.tensor(STATE)
_GOOD = torch.tensor([w.fixed and not w.broken for w in WORLDS], dtype=torch.double)
_BUGGY_CAT = torch.tensor([[CAT + w.buggy] for w in WORLDS])


@dataclass(frozen=True)
class Task:
    """A ToyRepair task (a BAR prompt)."""

    task_id: str
    buggy: int


@dataclass(frozen=True)
class Episode:
    """One rollout: the policy state before each action, the actions, and how it ended."""

    task: Task
    states: tuple[int, ...]
    actions: tuple[int, ...]
    submitted: bool
    resolved: bool

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else -1.0


def play(task: Task, actions: Sequence[int]) -> Episode:
    """Runs a fixed action list (cut at submit or the step budget)."""
    w, states = START[task.buggy], []
    for a in actions[:STEP_BUDGET]:
        states.append(STATE[w])
        if a == SUBMIT:
            good = WORLDS[w].fixed and not WORLDS[w].broken
            return Episode(task, tuple(states), tuple(actions[: len(states)]), True, good)
        w = NEXT[w][a]
    return Episode(task, tuple(states), tuple(actions[: len(states)]), False, False)


# 2. The softmax-tabular policy: sampling and exact evaluation.


class TabularPolicy:
    """Logits per (state, action), zero-initialised (uniform)."""

    def __init__(self) -> None:
        self.logits = torch.zeros(N_STATES, N_ACTIONS, dtype=torch.double, requires_grad=True)

    def probs(self) -> torch.Tensor:
        with torch.no_grad():
            return torch.softmax(self.logits, -1)

    def logprobs(self, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits[states], -1).gather(-1, actions[..., None]).squeeze(-1)

    def sampler(self) -> list[list[float]]:
        """Cumulative action probabilities per state, frozen for one round of sampling."""
        return [list(itertools.accumulate(row)) for row in self.probs().tolist()]

    def rollout(self, task: Task, cumulative: list[list[float]], rng: random.Random) -> Episode:
        actions: list[int] = []
        w = START[task.buggy]
        while len(actions) < STEP_BUDGET and (not actions or actions[-1] != SUBMIT):
            actions.append(min(bisect.bisect(cumulative[STATE[w]], rng.random()), N_ACTIONS - 1))
            w = NEXT[w][actions[-1]]
        return play(task, actions)


def _flow(probs: torch.Tensor, dist: torch.Tensor, blocked: Sequence[int]) -> torch.Tensor:
    """One step of the world distribution under the policy; mass taking a `blocked` action leaves."""
    flow = dist[:, None] * probs[_STATE]
    flow[:, list(blocked)] = 0
    return torch.zeros_like(dist).index_add_(0, _NEXT, flow.flatten())


def _start() -> torch.Tensor:
    dist = torch.zeros(len(WORLDS), dtype=torch.double)
    dist[START] = 1 / len(FILES)
    return dist


def success_rate(policy: TabularPolicy) -> float:
    """The exact probability that a rollout resolves a task (buggy file uniform)."""
    probs, dist, success = policy.probs(), _start(), 0.0
    for _ in range(STEP_BUDGET):
        success += float((dist * probs[_STATE, SUBMIT] * _GOOD).sum())
        dist = _flow(probs, dist, [SUBMIT])
    return success


def localisation_accuracy(policy: TabularPolicy) -> float:
    """The exact probability that the first file a rollout opens (`cat`) is the buggy one."""
    probs, dist, hit = policy.probs(), _start(), 0.0
    for _ in range(STEP_BUDGET):
        hit += float((dist * probs[_STATE].gather(1, _BUGGY_CAT).squeeze(1)).sum())
        dist = _flow(probs, dist, [*range(CAT, RUN_TESTS), SUBMIT])
    return hit


# 3. GRPO with BAR or fixed-N groups (docs/training.md §2.3, toy test 4).


@dataclass(frozen=True)
class ToyRollout(Rollout):
    """A BAR rollout that keeps its episode (the policy states and actions to train on)."""

    episode: Episode | None = None


class ToyRolloutSource:
    """A `RolloutSource[Task]`: rollouts of the current policy, seeded per (seed, task, call) so results do not
    depend on scheduling; counts the environment steps it spends."""

    def __init__(self, policy: TabularPolicy, seed: int) -> None:
        self.policy, self.seed = policy, seed
        self.env_steps = 0
        self._calls: dict[str, int] = {}
        self._cumulative = policy.sampler()

    def refresh(self) -> None:
        """Samples from the policy's current weights from now on."""
        self._cumulative = self.policy.sampler()

    async def sample(self, prompt: Task, n: int) -> list[Rollout]:
        k = self._calls.get(prompt.task_id, 0)
        self._calls[prompt.task_id] = k + 1
        rng = random.Random(f"{self.seed}/{prompt.task_id}/{k}")
        episodes = [self.policy.rollout(prompt, self._cumulative, rng) for _ in range(n)]
        self.env_steps += sum(len(e.actions) for e in episodes)
        return [
            ToyRollout(e.reward, Status.COMPLETED if e.submitted else Status.TRUNCATED, len(e.actions), episode=e)
            for e in episodes
        ]


def grpo_step(policy: TabularPolicy, optimizer: torch.optim.Optimizer, groups: Sequence[Sequence[Rollout]]) -> None:
    """One on-policy GRPO update on the groups (token-mean loss; groups without spread add zero-advantage tokens)."""
    if not groups:
        return
    episodes = [r.episode for g in groups for r in g]
    advantages = torch.cat([grpo_advantages(torch.tensor([r.reward for r in g])) for g in groups])
    pad = [STEP_BUDGET - len(e.actions) for e in episodes]
    states = torch.tensor([[*e.states, *[0] * p] for e, p in zip(episodes, pad, strict=False)])
    actions = torch.tensor([[*e.actions, *[0] * p] for e, p in zip(episodes, pad, strict=False)])
    mask = torch.tensor([[1.0] * len(e.actions) + [0.0] * p for e, p in zip(episodes, pad, strict=False)])
    logprobs = policy.logprobs(states, actions)
    loss, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


@dataclass(frozen=True)
class Update:
    """One GRPO update of a run."""

    env_steps: int
    """Environment steps spent so far."""
    success: float
    """The exact success rate after the update."""
    groups: int
    """Groups assembled for it (BAR: every prompt's group, before the filter)."""
    spread: int
    """Of those, groups whose rewards differ (non-zero GRPO advantages)."""


@dataclass(frozen=True)
class LearningCurve:
    """A GRPO run, update by update."""

    updates: list[Update]

    def steps_to(self, target: float) -> int | None:
        """Environment steps spent when the success rate first reached `target`; None if it never did."""
        return next((u.env_steps for u in self.updates if u.success >= target), None)

    def spread_fraction(self, target: float) -> float:
        """The fraction of groups with a reward spread, over the updates until the success rate reached `target`
        (the learning phase; a converged policy gives groups without spread)."""
        end = next((i + 1 for i, u in enumerate(self.updates) if u.success >= target), len(self.updates))
        return sum(u.spread for u in self.updates[:end]) / sum(u.groups for u in self.updates[:end])

    @property
    def final_success(self) -> float:
        return self.updates[-1].success


BAR_CONFIG = BarConfig(n=8, n_max=16, stride=8, rho_min=0.375, rho_max=0.625)
"""BAR's groups in the learning check: N = 8 of up to 16 rollouts, two rounds of 8."""
PROMPTS_PER_STEP = 4
"""BAR prompts per update; fixed-N GRPO takes twice as many groups of N, the same 64-rollout generation cap."""
SGD_LR, ADAM_LR = 3.0, 0.05


async def train_grpo(
    seed: int, bar: bool, env_steps: int, adam: bool = False, until: float | None = None
) -> LearningCurve:
    """GRPO on the tabular ToyRepair from a uniform policy until `env_steps` are spent (or the success rate
    reaches `until`), with BAR (the step's prompts through `collect_batch`, filtered groups) or fixed-N groups
    (all of them, as plain GRPO); SGD, or Adam (which rescales each update, so updates diluted by zero-advantage
    groups are not smaller)."""
    policy, tasks = TabularPolicy(), random.Random(f"tasks/{seed}")
    source = ToyRolloutSource(policy, seed)
    optimizer = torch.optim.Adam([policy.logits], lr=ADAM_LR) if adam else torch.optim.SGD([policy.logits], lr=SGD_LR)
    updates: list[Update] = []
    for step in itertools.count():
        if source.env_steps >= env_steps or (until is not None and updates and updates[-1].success >= until):
            break
        n_prompts = PROMPTS_PER_STEP if bar else PROMPTS_PER_STEP * BAR_CONFIG.n_max // BAR_CONFIG.n
        prompts = [Task(f"{step}-{i}", tasks.randrange(len(FILES))) for i in range(n_prompts)]
        if bar:
            batch = await collect_batch(source, prompts, n_prompts, BAR_CONFIG)
            assembled, train_on = [r.group for r in batch.results], batch.groups
        else:
            assembled = [await source.sample(p, BAR_CONFIG.n) for p in prompts]
            train_on = assembled
        grpo_step(policy, optimizer, train_on)
        source.refresh()
        spread = sum(len({r.reward for r in g}) > 1 for g in assembled)
        updates.append(Update(source.env_steps, success_rate(policy), len(assembled), spread))
    return LearningCurve(updates)


# 4. CA-SFT on scripted trajectories (docs/training.md §2.2, toy test 5).

CAREFUL, FIX_COMPETENCE = 0.4, 0.4
"""The scripted teacher [I]: a careful one (this share) runs the tests and opens the failing file, then edits it
(with FIX_COMPETENCE) or opens its caller and edits that instead (a fix in the wrong place); the others guess a
file, edit it and submit. So resolved rollouts are half lucky guesses, while failed careful ones still hold the
good localisation."""


def scripted_actions(task: Task, rng: random.Random) -> list[int]:
    """One scripted teacher rollout's actions."""
    if rng.random() < CAREFUL:
        wrong_place = [] if rng.random() < FIX_COMPETENCE else [CAT + (task.buggy + 1) % len(FILES)]
        return [RUN_TESTS, CAT + task.buggy, *wrong_place, EDIT, SUBMIT]
    return [CAT + rng.randrange(len(FILES)), EDIT, SUBMIT]


def oracle_value(w: World) -> float:
    """A rule-based retrospective value: 0.2, +0.3 once the agent knows the buggy file (it saw the failing test
    or opened the file), +0.3 while it has the buggy file open; 0.1 once it broke a correct file."""
    return 0.1 if w.broken else 0.2 + 0.3 * (w.known >= 0) + 0.3 * (w.open == w.buggy)


def oracle_key_steps(episode: Episode) -> list[KeyStep]:
    """Sparse key steps of the oracle's curve: the start, each side of every change, and the outcome at the end."""
    worlds = [START[episode.task.buggy]]
    for a in episode.actions:
        worlds.append(NEXT[worlds[-1]][a])
    values = [oracle_value(WORLDS[w]) for w in worlds]
    keys = [KeyStep(0, values[0])]
    for t in range(len(episode.actions)):
        if values[t + 1] != values[t]:
            keys += [KeyStep(t, values[t]), KeyStep(t + 1, values[t + 1])]
    return [*keys, KeyStep(len(episode.actions), 1.0 if episode.resolved else 0.0)]


OBSERVATION_TOKEN, PROMPT_TOKEN = N_ACTIONS, N_ACTIONS + 1


def to_trajectory(episode: Episode) -> tpb.Trajectory:
    """The episode as token-level steps: the action's token (mask 1), then an observation token (mask 0)."""
    traj = tpb.Trajectory(task_id=episode.task.task_id, prompt_tokens=tpb.TokenSpan(token_ids=[PROMPT_TOKEN], mask=[0]))
    for i, a in enumerate(episode.actions):
        traj.steps.add(index=i, tokens=tpb.TokenSpan(token_ids=[a, OBSERVATION_TOKEN], mask=[1, 0]))
    return traj


def trained_pairs(episode: Episode) -> list[tuple[int, int]] | None:
    """The (state, action) pairs CA-SFT trains on from one episode, through the real sample builder: every
    action of a resolved episode, the rise-segment actions of an unresolved one; None when there are none."""
    segments = (
        []
        if episode.resolved
        else extract_rise_segments(interpolate(oracle_key_steps(episode), len(episode.actions) + 1))
    )
    sample = ca_sample(to_trajectory(episode), episode.resolved, segments)
    if sample is None:
        return None
    actions = [t for t in sample.token_ids if t < N_ACTIONS]
    trained = [m for t, m in zip(sample.token_ids, sample.loss_mask, strict=False) if t < N_ACTIONS]
    replay = play(episode.task, actions)
    return [(s, a) for s, a, m in zip(replay.states, actions, trained, strict=False) if m]


def sft_dataset(seed: int, n_samples: int, with_rise: bool) -> list[list[tuple[int, int]]]:
    """n_samples CA-SFT samples from scripted rollouts: resolved ones only, or half resolved and half
    rise-segment samples of unresolved ones (the same resolved ones first)."""
    rng = random.Random(f"teacher/{seed}")
    resolved: list[list[tuple[int, int]]] = []
    rise: list[list[tuple[int, int]]] = []
    n_resolved = n_samples // 2 if with_rise else n_samples
    for i in itertools.count():
        if len(resolved) >= n_resolved and len(rise) >= n_samples - n_resolved:
            break
        task = Task(f"t{i}", rng.randrange(len(FILES)))
        episode = play(task, scripted_actions(task, rng))
        pairs = trained_pairs(episode)
        if pairs is not None:
            (resolved if episode.resolved else rise).append(pairs)
    return resolved[:n_resolved] + rise[: n_samples - n_resolved]


def train_sft(dataset: Sequence[Sequence[tuple[int, int]]], steps: int = 200, lr: float = 0.1) -> TabularPolicy:
    """Full-batch SFT (mean over trained actions) of a uniform tabular policy with Adam."""
    policy = TabularPolicy()
    pairs = [p for sample in dataset for p in sample]
    states, actions = torch.tensor([[s for s, _ in pairs]]), torch.tensor([[a for _, a in pairs]])
    optimizer = torch.optim.Adam([policy.logits], lr=lr)
    for _ in range(steps):
        loss = sft_loss(policy.logprobs(states, actions), torch.ones(states.shape, dtype=torch.double))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy


# 5. Rubric-mixed rewards in all-failed groups (docs/training.md §2.5).


def judge(episode: Episode) -> float:
    """A rule-based stand-in for the rubric judge: the share of five process checks the episode passes."""
    acts, buggy = episode.actions, episode.task.buggy
    edits = [t for t, a in enumerate(acts) if a == EDIT]
    tests = [t for t, a in enumerate(acts) if a == RUN_TESTS]
    opened = [t for t, a in enumerate(acts) if a == CAT + buggy]
    checks = [
        bool(tests),
        bool(opened),
        bool(edits) and bool(opened) and opened[0] < edits[0],
        bool(edits) and bool(tests) and tests[-1] > edits[-1],
        episode.submitted,
    ]
    return sum(checks) / len(checks)


@dataclass(frozen=True)
class GroupSpread:
    """Whether one group's GRPO advantages have a spread, from outcome rewards alone and with the judge mixed in."""

    all_failed: bool
    outcome: bool
    rpr: bool


def _outcome(e: Episode) -> int:
    if e.resolved:
        return tpb.OUTCOME_STATUS_RESOLVED
    return tpb.OUTCOME_STATUS_UNRESOLVED if e.submitted else tpb.OUTCOME_STATUS_TRUNCATED


def rpr_spreads(seed: int, n_groups: int, group_size: int = 8) -> list[GroupSpread]:
    """Groups of a uniform policy's rollouts (mostly all failed), with and without R' = R_bin + alpha·J."""
    policy, rng = TabularPolicy(), random.Random(f"rpr/{seed}")
    cumulative = policy.sampler()
    spreads = []
    for i in range(n_groups):
        task = Task(f"r{i}", rng.randrange(len(FILES)))
        episodes = [policy.rollout(task, cumulative, rng) for _ in range(group_size)]
        statuses = [_outcome(e) for e in episodes]
        spreads.append(
            GroupSpread(
                not any(e.resolved for e in episodes),
                bool(rpr_advantages(statuses, [None] * group_size).var() > 0),
                bool(rpr_advantages(statuses, [judge(e) for e in episodes]).var() > 0),
            )
        )
    return spreads


# 6. OPD towards a bigram teacher (docs/training.md §2.4, toy test 2).


def kl_to_teacher(model: torch.nn.Module, teacher: torch.Tensor, prefixes: torch.Tensor) -> float:
    """Exact full-vocabulary KL(pi_s || pi_t) at every position of the held-out prefixes."""
    with torch.no_grad():
        log_s = torch.log_softmax(model(input_ids=prefixes).logits, -1)
    return float((log_s.exp() * (log_s - teacher[prefixes])).sum(-1).mean())


def distill_bigram(
    seed: int = 0, steps: int = 200, kind: OpdLoss = OpdLoss.JS_SKEW, vocab: int = 16, seq: int = 8, batch: int = 16
) -> tuple[float, float]:
    """OPD of a random-init student towards a fixed random bigram teacher on the student's own samples:
    the exact KL on held-out prefixes (before, after)."""
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.log_softmax(2.0 * torch.randn(vocab, vocab, generator=gen), -1)
    held_out = torch.randint(0, vocab, (64, 8), generator=gen)
    student = tiny_lm(vocab, seed + 1)
    optimizer = torch.optim.Adam(student.parameters(), lr=3e-3)
    before = kl_to_teacher(student, teacher, held_out)
    for _ in range(steps):
        seqs = torch.randint(0, vocab, (batch, 1), generator=gen)
        with torch.no_grad():  # the student samples its own continuations
            for _ in range(seq - 1):
                logits = student(input_ids=seqs).logits[:, -1]
                seqs = torch.cat([seqs, torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)], 1)
        ls = token_logprobs(student(input_ids=seqs).logits, seqs)
        lt = torch.nn.functional.pad(teacher[seqs[:, :-1], seqs[:, 1:]], (1, 0))
        mask = torch.ones_like(ls)
        mask[:, 0] = 0  # the first token is a given prefix, not sampled
        loss = opd_loss(ls, lt, mask, kind)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return before, kl_to_teacher(student, teacher, held_out)
