"""A stock of named items."""


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, quantity=1):
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self.items[name] = self.items.get(name, 0) + quantity

    def remove(self, name, quantity=1):
        have = self.items.get(name, 0)
        if quantity > have:
            raise KeyError(name)
        if quantity == have:
            del self.items[name]
        else:
            self.items[name] = have - quantity

    def count(self, name):
        return self.items.get(name, 0)

    def total(self):
        return sum(self.items.values())
