"""Which agents an update trains: frozen agents never, and with ``algorithm.alternate_every: N`` the
trainable agents take turns of N steps each, in the order of ``agents`` (the task's turn order).

The schedule is state carried by checkpoints (:meth:`AlternationSchedule.state`), so a resumed run goes
on with the agent and the step of its turn where it stopped, even if ``alternate_every`` changed.
"""

from __future__ import annotations

from accord.config import ConfigError


class AlternationSchedule:
    """The agent whose turn it is (``agents[position]``) and how many steps of its turn are done."""

    def __init__(self, agents: list[str], every: int):
        if not agents or every < 1:
            raise ValueError("an alternation schedule needs agents and every >= 1")
        self.agents, self.every = list(agents), every
        self.position, self.done = 0, 0

    @property
    def active(self) -> str:
        """The agent trained at the current step."""
        return self.agents[self.position]

    def advance(self) -> None:
        """One step of the current turn is done; after ``every`` of them the next agent's turn starts."""
        self.done += 1
        if self.done >= self.every:
            self.position, self.done = (self.position + 1) % len(self.agents), 0

    def state(self) -> dict:
        return {"agents": list(self.agents), "active": self.active, "done": self.done}

    def restore(self, state: dict | None, step: int) -> None:
        """Continue from a checkpoint's :meth:`state`; without one (a checkpoint of a run that did not alternate)
        the turn is the one that ``step`` steps of this schedule reach."""
        if state is None:
            turns, self.done = divmod(step, self.every)
            self.position = turns % len(self.agents)
            return
        if state["agents"] != self.agents:
            raise ConfigError(f"the checkpoint alternates agents {state['agents']}, this config {self.agents}; resume "
                              "with the agents (and trainable flags) it was trained with")
        self.position = self.agents.index(state["active"])
        self.done = min(int(state["done"]), self.every - 1)
