// Appends one line to Pi's system prompt, so a "Pi + demo package" cell differs from a Bare Pi
// cell in what reaches the provider (the proxy can see it), and registers /bench-demo.
const MARKER = "[pi-bench-demo] Run the task's own checks before you finish.";

export default function (pi) {
  pi.on("before_agent_start", async (event) => ({
    systemPrompt: `${event.systemPrompt}\n\n${MARKER}`,
  }));
  pi.registerCommand("bench-demo", {
    description: "Say that the pi-bench-demo package is loaded",
    handler: async (_args, ctx) => ctx.ui.notify("pi-bench-demo is loaded", "info"),
  });
}
