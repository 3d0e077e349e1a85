"""zrl's version (``zrl.__version__`` re-exports it): in a module of the lowest layer, so the
roles and the broker that send it in every HELLO need not import the package root, which
names the top of the tree (``zrl.Experiment``)."""

__version__ = "0.1.0"
