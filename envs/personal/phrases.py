"""What the simulated user says, shared by the environment and the tiny model's warm-start data."""

SYSTEM_PROMPT = "You are a helpful assistant."
MOVE_ON = ("Thanks! Next question: {q}", "Great, thank you. {q}", "Got it. Now: {q}")
REASK = ("Hmm. {q}", "Let me ask again. {q}", "{q}")
STILL_WRONG = "Still not what I asked for. {directive}"

# How users word a wish for each option besides the canonical directive (preferences.DIRECTIVES). The canonical
# directive and the first TRAINING_PHRASINGS of these are the training part: the tiny model's warm start uses the
# canonical directive only, and the judge's request patterns (config.JudgeConfig) were written before this bank.
# Users who speak freely (rollout.env_args.phrasing: free) say only the rest: wordings nothing was fitted to.
TRAINING_PHRASINGS = 1
PHRASINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "format": {
        "plain": ("please reply with only the number and unit",
                  "could you just give me the bare number and unit?",
                  "only the quantity, no sentence around it please",
                  "I'd like nothing but the value and its unit",
                  "just the number with the unit is all I need"),
        "tags": ("please wrap the answer in <ans></ans>",
                 "could you wrap the result in <ans> tags?",
                 "I want the value inside <ans> and </ans>",
                 "stick the answer between <ans> tags please",
                 "the result goes in <ans> tags, remember"),
        "sentence": ("please phrase it as 'The answer is ...'",
                     "can you say 'The answer is' and then the value?",
                     "I'd like a whole sentence that begins with 'The answer is'",
                     "write it out as a sentence, like 'The answer is 5 km.' please",
                     "make sure to open with 'The answer is'"),
    },
    "units": {
        "symbol": ("please use unit symbols such as kg",
                   "could you use the short unit symbols, km and so on?",
                   "abbreviate the units please, like cm",
                   "I prefer units as symbols, km not the long word",
                   "short unit symbols would be better for me"),
        "word": ("please write units as full words such as grams",
                 "spell the units out please",
                 "could you write kilometers instead of km?",
                 "I'd rather see the units written in full, like liters",
                 "no abbreviations for units, spell them out"),
    },
    "tone": {
        "none": ("please do not open with a greeting",
                 "skip the pleasantries",
                 "could you get straight to the point without 'Sure!'?",
                 "no need for an opener like 'Certainly.'",
                 "I'd rather you didn't start with a cheerful word"),
        "sure": ("please begin with 'Sure!'",
                 "can you open with a 'Sure!' first?",
                 "I like it when you start with 'Sure!'",
                 "kick off with 'Sure!' please",
                 "say 'Sure!' before the answer"),
        "certainly": ("please begin with 'Certainly.'",
                      "could you open with 'Certainly.'?",
                      "I'd like your reply to start with 'Certainly.'",
                      "lead with 'Certainly.' please",
                      "begin by saying 'Certainly.' first"),
    },
    "length": {
        "short": ("please leave out the explanation",
                  "no need to explain the sum",
                  "could you skip the working and just answer?",
                  "I don't need the reasoning, only the answer",
                  "keep it short, no explanation"),
        "explain": ("please show the addition after the answer",
                    "can you add the sum after the answer, like 3 + 4 = 7?",
                    "I'd like to see how you added it up",
                    "show your working after the answer please",
                    "give the calculation too, after the result"),
    },
    "closing": {
        "none": ("please do not add a closing line",
                 "drop the sign-off please",
                 "could you stop ending with 'Hope this helps!'?",
                 "I'd rather you didn't add a closing remark",
                 "no closing pleasantries at the end"),
        "thanks": ("please finish with 'Hope this helps!'",
                   "can you close with 'Hope this helps!'?",
                   "I'd like a 'Hope this helps!' at the end",
                   "sign off with 'Hope this helps!' please",
                   "finish on a 'Hope this helps!'"),
    },
}
# Complaints that name no option: the judge may score them, but they carry no hint. The first
# TRAINING_COMPLAINTS are the training part.
TRAINING_COMPLAINTS = 2
VAGUE_COMPLAINTS = (
    "That's not how I like my answers.",
    "Not quite what I wanted.",
    "Nope, that is not my style.",
    "Hmm, you know how I like it.",
    "Ugh, that's not it.",
    "I've told you how I like my answers.",
)
HELDOUT_COMPLAINTS = VAGUE_COMPLAINTS[TRAINING_COMPLAINTS:]
# How a freely speaking user opens a correction, before the wishes
CORRECTION_OPENERS = ("", "No. ", "Hmm, not quite. ", "Nope. ", "Not like that. ")


def heldout_phrasings(kind: str, option: str) -> tuple[str, ...]:
    """The wordings of this wish that a freely speaking user says."""
    return PHRASINGS[kind][option][TRAINING_PHRASINGS:]
