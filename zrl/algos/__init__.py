"""The algorithms zrl runs: one package each (``zrl/algos/<name>/``, see ``zrl.algos.api``),
named by ``algo`` in a config through the registry ``zrl.algos.registry``."""
