"""Studies built on the library: protocols that plan many runs on the comparison's scheduler
(``experiment/compare.py``'s :func:`~longrange.experiment.compare.run_grid`), select and score
their results, and write their tables.

* :mod:`longrange.studies.mad`: MAD's synthetic protocol (Poli et al. 2024), from scratch and with
  causal self-pretraining (``longrange mad``); its report in :mod:`longrange.studies.mad_report`,
  the screen's claims and their test in :mod:`longrange.studies.mad_claims`;
* :mod:`longrange.studies.zoology`: MQAR accuracy against state size over widths (Zoology's axis),
  both regimes (``longrange zoology``);
* :mod:`longrange.studies.tables`: a study's runs as rows and the tables the study scripts print
  (SPT against scratch paired by seed, rankings and their reversals, pooled settings, texts of
  results over seeds, results written atomically);
* :mod:`longrange.studies.grid`: a grid of single training runs (presets with overrides, at seeds)
  on the scheduler, as the synthetic tables train them;

so that the study scripts (``benchmarks/recall_spt.py``, ``small_scale_spt.py``,
``synthetic_tables.py``) only name their settings and lay out their own tables.
"""
