"""Flower mod: replace a train reply's weights by its SignDS upload (SignDS-FL, Jiang et al. 2022).

Needs its server counterpart: the ServerApp's strategy must be
:class:`flwr_dp_strategies.SignDS` (it takes FedAvg's arguments), which puts the SignDS
parameters in every train config; with any other strategy the mod refuses every train
message with one error saying so (nothing leaves the client).

Attach to train: ``@app.train(mods=[signds_mod])``. The train function returns the
trained weights as usual; the mod

1. reads the received global weights *before* training (one ArrayRecord; its key
   order fixes the flattening, as MindSpore's ``updateFeatureName``);
2. computes update = trained − received, flattened in that order;
3. encodes it with :func:`flwr_dp_strategies.signds.encode_update`, using the
   parameters, r_est and phase the server put in the train config
   (:data:`CONFIG_KEYS`, set by :class:`flwr_dp_strategies.SignDS`);
4. replaces the reply's ArrayRecord by ``indices`` (int64, sorted), ``sign`` and
   ``b-hat`` (int64, one value each): no float of the update leaves the client;
5. declares the round's release (``round_event(sign_eps, rr_epsilon)``).

Evaluate and query messages pass through. The parameters (hence ε) come from the
server; :func:`make_signds_mod` gives a mod that refuses a larger ``sign_eps``,
``rr_eps`` or ``max_dim_out`` than the client's own caps. Randomness: fresh OS entropy for every
encoding (the ClientApp is pickled to simulation workers for every message).
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.clientapp.typing import ClientAppCallable

from client_mods.reply_metrics import settle_metrics
from flwr_dp_strategies.declarations import declare_release
from flwr_dp_strategies.npy_codec import npy_view, to_array
from flwr_dp_strategies.signds import MagRRConfig, encode_update, round_event
from flwr_dp_strategies.wire import SIGNDS_CONFIG_KEYS, SIGNDS_EVENT_LABEL, flat_update

EVENT_LABEL = SIGNDS_EVENT_LABEL
CONFIG_KEYS = SIGNDS_CONFIG_KEYS


class SignDSConfigMissing(KeyError):
    """The train config lacks SignDS parameters: the server does not run ``flwr_dp_strategies.SignDS``."""

    def __str__(self) -> str:  # KeyError would print the message quoted, as a key
        return str(self.args[0])


def signds_settings(config: ConfigRecord) -> dict:
    """The encoder's keyword arguments from a train message's ConfigRecord.

    Raises :class:`SignDSConfigMissing` (a KeyError) naming the missing keys and the server
    strategy that sends them.
    """
    missing = [key for key in CONFIG_KEYS.values() if key not in config]
    if len(missing) == len(CONFIG_KEYS):
        raise SignDSConfigMissing(
            "signds_mod needs the server strategy flwr_dp_strategies.SignDS: this train message carries none of "
            "the SignDS parameters it sends (signds-sign-k, signds-sign-eps, ...), so the ServerApp runs another "
            "strategy. Use SignDS(...) in the ServerApp (it takes FedAvg's arguments), or remove signds_mod "
            "from @app.train(mods=[...]). Nothing was sent."
        )
    if missing:
        raise SignDSConfigMissing(
            f"signds_mod: the train config lacks {missing}; the ServerApp's "
            "flwr_dp_strategies.SignDS sends them all (a different version?). Nothing was sent."
        )
    magrr = MagRRConfig(
        rr_epsilon=float(config[CONFIG_KEYS["rr_epsilon"]]),
        growth_margin=float(config[CONFIG_KEYS["growth_margin"]]),
        shrink_margin=float(config[CONFIG_KEYS["shrink_margin"]]),
    )
    return {
        "sign_k": float(config[CONFIG_KEYS["sign_k"]]),
        "sign_eps": float(config[CONFIG_KEYS["sign_eps"]]),
        "sign_thr_ratio": float(config[CONFIG_KEYS["sign_thr_ratio"]]),
        "sign_dim_out": int(config[CONFIG_KEYS["sign_dim_out"]]),
        "max_dim_out": int(config[CONFIG_KEYS["max_dim_out"]]),
        "r_est": float(config[CONFIG_KEYS["r_est"]]),
        "is_reached": int(config[CONFIG_KEYS["is_reached"]]),
        "magrr": magrr,
    }


def make_signds_mod(
    *, max_sign_eps: float = 100.0, max_rr_eps: float = 5.0, max_dim_out: int = 100, release_metrics: bool = False
):
    """A :func:`signds_mod` that refuses (raises, so the reply is an error and nothing leaves)
    when the server asks for more than the client's own caps: a client bounds its own ε.
    ``release_metrics=True`` sends the train metrics as they are, declared non-private."""

    def capped_signds_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if msg.metadata.message_type.split(".")[0] == "train":
            settings = signds_settings(next(iter(msg.content.config_records.values())))
            asked = {
                "sign_eps": (settings["sign_eps"], max_sign_eps),
                "rr_eps": (settings["magrr"].rr_epsilon, max_rr_eps),
                "max_dim_out": (settings["max_dim_out"], max_dim_out),
            }
            for name, (value, cap) in asked.items():
                if value > cap:
                    raise ValueError(f"signds_mod: the server asks {name}={value}, above this client's cap {cap}")
        return signds_mod(msg, context, call_next, release_metrics=release_metrics)

    return capped_signds_mod


def signds_mod(
    msg: Message, context: Context, call_next: ClientAppCallable, *, release_metrics: bool = False
) -> Message:
    """Encode the train reply's update as a SignDS upload; needs the server's flwr_dp_strategies.SignDS.

    See the module docstring. The reply's train metrics and exact ``num-examples`` are replaced by a public weight
    unless ``release_metrics=True`` (then declared non-private: :mod:`client_mods.reply_metrics`).
    """
    if msg.metadata.message_type.split(".")[0] != "train":
        return call_next(msg, context)
    if len(msg.content.array_records) != 1 or len(msg.content.config_records) < 1:
        raise ValueError("signds_mod expects one ArrayRecord and a ConfigRecord in the train message")
    record = next(iter(msg.content.array_records.values()))
    # zero-copy views of the received payloads: immutable bytes, so the train function cannot change them
    received = {key: npy_view(record[key]) for key in record.keys()}
    settings = signds_settings(next(iter(msg.content.config_records.values())))
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    if len(reply.content.array_records) != 1:
        raise ValueError("signds_mod expects exactly one ArrayRecord in the train reply")
    name, trained = next(iter(reply.content.array_records.items()))
    upload = encode_update(flat_update(received, trained), **settings)
    reply.content[name] = ArrayRecord(
        {
            "indices": to_array(upload.indices.astype(np.int64)),
            "sign": to_array(np.array([upload.sign], dtype=np.int64)),
            "b-hat": to_array(np.array([upload.b_hat], dtype=np.int64)),
        }
    )
    declare_release(
        reply.content,
        round_event(settings["sign_eps"], settings["magrr"].rr_epsilon),
        label=EVENT_LABEL,
        neighboring_relation="replace_one",
    )
    settle_metrics(reply.content, release_metrics=release_metrics)
    return reply


__all__ = [
    "CONFIG_KEYS",
    "EVENT_LABEL",
    "SignDSConfigMissing",
    "flat_update",
    "make_signds_mod",
    "signds_mod",
    "signds_settings",
]
