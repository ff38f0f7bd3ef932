"""The router: admission, lanes, placement and dispatch in front of the prefill and decode pools.

Never imports torch: it talks to workers through Ray handles and typed messages.
"""
