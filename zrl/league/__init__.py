"""A self-play league (AlphaStar, DI-engine): the learning players (the main agent, main
exploiters, league exploiters), their snapshots and fixed opponents, and the rules that pick
opponents, take snapshots and reset exploiters.

Pure logic (numpy, stdlib, pydantic): no sockets, no torch.

- the ``league:`` section (``LeagueConfig``) lives in ``zrl.config.league``.
- ``payoff``: decayed win/draw/loss counts per pair (``Payoff``).
- ``pfsp``: prioritized fictitious self-play weights (``pfsp_weights``).
- ``elo``: Elo ratings (``Elo``).
- ``population``: the population and its rules (``League``).
"""
