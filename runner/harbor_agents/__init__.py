"""Harbor agents for the lock's harnesses (Pi on Node, OMP on Bun), installed offline.

``plan`` builds what runs in the task container from the lock (no Harbor import, so it is
tested anywhere); ``agents`` holds the Harbor classes, loaded by the guest's Harbor with
``--agent runner.harbor_agents.agents:PiAgent`` (or ``OmpAgent``).
"""
