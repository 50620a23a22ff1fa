"""A new strategy in one class: the noisy mean of clipped updates (docs/architecture.md, "Add a strategy").

Per round it releases :math:`w + \\frac1m\\sum_i \\bar\\Delta_i + \\mathcal N(0, (zC/m)^2 I)`, each update
:math:`\\Delta_i = w_i - w` clipped to L2 norm C, over the public number m of sampled clients. Adding
or removing one client moves the sum by at most C, so the release is the Gaussian mechanism with
noise multiplier z under ``add_or_remove_one``: one ``GaussianDpEvent(z)`` per round for the
federation. Screening, booking, saving the ledger and publishing ε are the template's.
"""

from __future__ import annotations

from typing import Any

from dp_accounting.dp_event import GaussianDpEvent
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import FedAvg

from flwr_dp_strategies.privacy.rng import RngSource
from flwr_dp_strategies.rounds.central_release import fixed_denominator_release
from flwr_dp_strategies.rounds.options import split_accounting
from flwr_dp_strategies.rounds.reply_screening import array_spec, screen_train_content
from flwr_dp_strategies.rounds.streaming_aggregation import ClippedSum, npy_view
from flwr_dp_strategies.rounds.template import AccountedRound, Booking, RoundRelease, Screened


class NoisyClippedMean(AccountedRound, FedAvg):
    """FedAvg's arguments first (in FedAvg's order), then the mechanism's, keyword-only."""

    def __init__(
        self,
        *args: Any,
        clipping_norm: float,
        noise_multiplier: float,
        num_sampled_clients: int,
        rng: Any = None,
        **kwargs: Any,
    ) -> None:
        accounting, flower = split_accounting(kwargs)  # ledger, ledger_path, resume, ... (AccountingOptions)
        super().__init__(*args, **flower)
        self.init_accounted_round(neighboring_relation="add_or_remove_one", **accounting)
        self.clipping_norm, self.noise_multiplier = float(clipping_norm), float(noise_multiplier)
        self.num_sampled_clients = int(num_sampled_clients)
        self.rng = RngSource(rng)  # OS entropy unless a seed is given (tests)
        self.current = ArrayRecord()

    def instruct_train(self, server_round, arrays, config, grid):
        self.current, self._spec = arrays, array_spec(arrays)  # the model every update is clipped against
        return super().instruct_train(server_round, arrays, config, grid)

    def train_check(self):
        return lambda content: screen_train_content(
            content, self._spec, self.weighted_by_key, check_values=False, max_weight=self.max_weight
        )

    def release_train(self, server_round: int, screened: Screened) -> RoundRelease:
        summed = ClippedSum({key: npy_view(a) for key, a in self.current.items()}, self.clipping_norm)
        screened.add_clipped(summed)
        m = self.num_sampled_clients
        arrays = fixed_denominator_release(summed, m, self.noise_multiplier * self.clipping_norm / m, self.rng())
        event = GaussianDpEvent(self.noise_multiplier)  # sensitivity C/m, noise zC/m
        return RoundRelease(
            arrays, None, [Booking(event, "noisy-clipped-mean", neighboring_relation="add_or_remove_one")]
        )
