"""What the simulated user says, shared by the environment and the tiny model's warm-start data."""

SYSTEM_PROMPT = "You are a helpful assistant."
MOVE_ON = ("Thanks! Next question: {q}", "Great, thank you. {q}", "Got it. Now: {q}")
REASK = ("Hmm. {q}", "Let me ask again. {q}", "{q}")
STILL_WRONG = "Still not what I asked for. {directive}"
