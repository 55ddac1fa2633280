"""The Textual chat front end (`localspec chat`): watch speculative decoding work, live."""
