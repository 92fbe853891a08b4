"""Talking to GUI environments: the session protocol client, the action model, and the embedded
MiniWoB++ environment server. Imports no other package of this project and no Ray."""
