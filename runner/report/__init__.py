"""The report of a run: what its files prove (evidence.py), the analysis and statistics of its
ledger (analysis.py, paired.py, order_effects.py, stats.py), the receipt that records them with
the judge and the frozen identities (receipt.py, judge.py, identities.py), signed with the
operator's key (signing.py), and the document both renderers format (the *_sections.py modules,
markdown.py, html_page.py, plots.py); write.py writes them all."""
