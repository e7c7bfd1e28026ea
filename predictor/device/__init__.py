"""The device layer: normalisation on the device, worker streams and slots, failure classes, the workers of several devices."""
