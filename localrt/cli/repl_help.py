"""What the chat's `/?`, `/set`, `/set parameter` and `/show` print when asked what exists (Ollama's texts, less what
localrt's chat does not have)."""

from __future__ import annotations

HELP = """Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use \"\"\" to begin a multi-line message."""

SET_HELP = """Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set format json       Enable JSON mode
  /set noformat          Disable formatting
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
  /set wordwrap          Enable wordwrap
  /set nowordwrap        Disable wordwrap
  /set think             Enable thinking
  /set nothink           Disable thinking

Use \"\"\" to begin a multi-line system message."""

# (name, argument, what it does): each name is one the daemon's option resolver accepts (a test holds it to that)
PARAMETERS = (
    ("seed", "<int>", "Random number seed"),
    ("num_predict", "<int>", "Max number of tokens to predict"),
    ("top_k", "<int>", "Pick from top k num of tokens"),
    ("top_p", "<float>", "Pick token based on sum of probabilities"),
    ("min_p", "<float>", "Pick token based on top token probability * min_p"),
    ("num_ctx", "<int>", "Set the context size"),
    ("temperature", "<float>", "Set creativity level"),
    ("repeat_penalty", "<float>", "How strongly to penalize repetitions"),
    ("repeat_last_n", "<int>", "Set how far back to look for repetitions"),
    ("num_gpu", "<int>", "The number of layers to send to the GPU"),
    ("stop", "<string> <string> ...", "Set the stop parameters"),
)

PARAMETERS_HELP = "Available Parameters:\n" + "\n".join(
    f"  /set parameter {f'{name} {arg}':<24} {what}" for name, arg, what in PARAMETERS
)

SHOW_HELP = """Available Commands:
  /show info         Show details for this model
  /show license      Show model license
  /show modelfile    Show Modelfile for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template"""

SHORTCUTS_HELP = """Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
   Alt + b            Move back (left) one word
   Alt + f            Move forward (right) one word
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor

  Ctrl + l            Clear the screen
  Ctrl + c            Stop the model from responding
  Ctrl + d            Exit (/bye)"""
