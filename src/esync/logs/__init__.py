"""What a run writes about itself: per-round records, TensorBoard scalars, the phases' breakdown, reports to the live job page."""
