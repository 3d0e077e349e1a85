"""``python -m zrl``: the ``zrl`` command. Roles run through this module too, started as
``python -m zrl`` (``zrl.run.children``) or forked by the zygote (``zrl.run.zygote``), which
builds ``command()`` once and calls ``main()`` in each role."""

from zrl.cli.main import command, main

__all__ = ["command", "main"]

if __name__ == "__main__":
    main()
