"""Client-side mechanisms for Flower ClientApps (mods, trainers, data wrappers).

Every mechanism here draws its noise from :mod:`flwr_dp_strategies.privacy`
(no mechanism is written twice) and describes its release as a DpEvent.
"""

__all__: list[str] = []
