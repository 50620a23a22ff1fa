r"""The participation rule of banded matrix factorisation: b-min-separation and at most k rounds per client,
enforced over node ids (no Flower here).

:class:`CyclicParticipation` splits the nodes into b groups; release t (1-based, counted over the whole run,
restarts included) trains group :math:`(t-1) \bmod b`. A node joins the smallest group when first seen (ties:
the lowest group; new nodes of one call in an order shuffled from the sampler's generator) and never changes
group, so its rounds are exactly b apart. It trains in at most k releases. The rule the sensitivity of
:mod:`.matrix_factorization` needs is checked per node by :meth:`CyclicParticipation.violation` before a
reply is aggregated (a node whose last aggregated release is less than b ago, or that has k, is refused), so a
sampler bug, a reassigned node id or a restored history that disagrees cannot break it silently.

The history (group, count and last release of every node) is public: it depends on node ids and the
sampler's generator only, never on the clients' data. :meth:`to_state` / :meth:`from_state` keep it in
the ledger file's signed state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Optional

import numpy as np

from ..rng import RngLike, RngSource
from ..validation import check_int


class CyclicParticipation:
    """Cyclic participation over ``num_groups`` = b groups, at most ``max_participations`` = k rounds a node.

    ``rng``: orders the new nodes before they join groups (OS entropy by default, a seed in tests).
    """

    def __init__(self, num_groups: int, max_participations: int, rng: RngLike = None) -> None:
        self.num_groups = check_int("num_groups", num_groups, minimum=1)
        self.max_participations = check_int("max_participations", max_participations, minimum=1)
        self.rng = RngSource(rng)
        self.groups: dict[int, int] = {}
        self.counts: dict[int, int] = {}
        self.last: dict[int, int] = {}

    def group_of_release(self, release_index: int) -> int:
        """The group that trains in release t: (t − 1) mod b."""
        return (check_int("release_index", release_index, minimum=1) - 1) % self.num_groups

    def assign(self, nodes: Iterable[int]) -> None:
        """Put every node not seen before into the smallest group (its group is then fixed)."""
        new = sorted({int(n) for n in nodes} - set(self.groups))
        if not new:
            return
        order = self.rng().permutation(len(new))
        sizes = np.bincount(np.fromiter(self.groups.values(), dtype=np.int64), minlength=self.num_groups)
        for index in order:
            group = int(np.argmin(sizes))
            self.groups[new[index]] = group
            sizes[group] += 1

    def violation(self, node: int, release_index: int) -> Optional[str]:
        """Why ``node`` may not be aggregated in release t (None: it may): it has k releases already, or its
        last one is less than b releases ago."""
        node = int(node)
        if self.counts.get(node, 0) >= self.max_participations:
            return f"node {node} has already trained in {self.max_participations} releases (the cap k)"
        last = self.last.get(node)
        if last is not None and release_index - last < self.num_groups:
            return (
                f"node {node} trained in release {last}, less than b={self.num_groups} releases before {release_index}"
            )
        return None

    def select(self, nodes: Iterable[int], release_index: int) -> list[int]:
        """The nodes (sorted) that train in release t: the connected members of its group that the rule admits."""
        nodes = sorted({int(n) for n in nodes})
        self.assign(nodes)
        group = self.group_of_release(release_index)
        return [n for n in nodes if self.groups[n] == group and self.violation(n, release_index) is None]

    def record(self, nodes: Iterable[int], release_index: int) -> None:
        """Count release t for each node aggregated in it (ValueError if one breaks the rule)."""
        for node in nodes:
            reason = self.violation(node, release_index)
            if reason is not None:
                raise ValueError(reason)
            self.counts[int(node)] = self.counts.get(int(node), 0) + 1
            self.last[int(node)] = int(release_index)

    # ------------------------------------------------------------------ persistence
    def to_state(self) -> dict[str, Any]:
        """The history as JSON values: b, k and one [node, group, count, last] row per node (last 0: never)."""
        rows = [[n, g, self.counts.get(n, 0), self.last.get(n, 0)] for n, g in sorted(self.groups.items())]
        return {"num_groups": self.num_groups, "max_participations": self.max_participations, "nodes": rows}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`to_state`'s value; ValueError naming what is wrong (another b or k, a malformed
        row): a history that does not fit the configuration is never adopted."""
        if not isinstance(state, Mapping) or set(state) != {"num_groups", "max_participations", "nodes"}:
            raise ValueError(f"participation state must hold num_groups, max_participations and nodes, got {state!r}")
        if state["num_groups"] != self.num_groups or state["max_participations"] != self.max_participations:
            raise ValueError(
                f"participation state was saved for num_groups={state['num_groups']!r}, max_participations="
                f"{state['max_participations']!r}; this run has {self.num_groups}, {self.max_participations}"
            )
        groups, counts, last = {}, {}, {}
        for row in state["nodes"] if isinstance(state["nodes"], list) else [None]:
            if (
                not isinstance(row, list)
                or len(row) != 4
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row)
                or row[1] >= self.num_groups
                or row[2] > self.max_participations
                or (row[2] == 0) != (row[3] == 0)
                or row[0] in groups
            ):
                raise ValueError(f"participation state: malformed node row {row!r}")
            groups[row[0]] = row[1]
            if row[2]:
                counts[row[0]], last[row[0]] = row[2], row[3]
        self.groups, self.counts, self.last = groups, counts, last


__all__ = ["CyclicParticipation"]
