"""Roman numerals."""

NUMERALS = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]


def to_roman(number):
    if not 0 < number < 4000:
        raise ValueError("out of range")
    out = []
    for value, numeral in NUMERALS:
        while number >= value:
            out.append(numeral)
            number -= value
    return "".join(out)


def from_roman(text):
    values = {numeral: value for value, numeral in NUMERALS if len(numeral) == 1}
    total = 0
    for i, ch in enumerate(text):
        value = values[ch]
        if i + 1 < len(text) and values[text[i + 1]] > value:
            total -= value
        else:
            total += value
    return total
