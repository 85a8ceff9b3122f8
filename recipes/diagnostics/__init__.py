"""Training-time measurements: the step-hook contract, the collapse hook, and the diagnostics it runs (MI proxies on
the unfiltered batch, the collapse alert)."""
