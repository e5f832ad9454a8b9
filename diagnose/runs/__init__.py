"""Multi-capture orchestrations: the SLO-edge search (goodput, goodput_search) and experiment."""
