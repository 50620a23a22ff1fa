"""The plumbing every strategy's round goes through (no strategy lives here).

* :mod:`.client_accounting` - the ledger, reply screening and declarations of a strategy;
* :mod:`.reply_screening` - what a reply must look like to be aggregated;
* :mod:`.streaming_aggregation` - O(d) aggregation of replies read zero-copy;
* :mod:`.central_release` - the clipped sum over a public denominator plus noise, sampling;
* :mod:`.secure_aggregation` - the SecAgg+ stages a strategy runs inside its round;
* :mod:`.metrics` - the ledger's figures in a round's metrics, Flower's metric arithmetic.
"""
