"""Built-in English text used to train the tiny tokenizer (written for accord; no external data)."""

from __future__ import annotations

import itertools

PROSE = """\
The team of agents works together on one shared task. Each agent reads the question, writes a short
answer, and passes its work to the next agent. A reviewer checks the answer and gives a reward when
the final result is correct. When the answer is wrong, the agents try again and learn from the mistake.
Good cooperation means that every member explains the plan clearly, listens to the others, and keeps
the reply short and useful. The assistant should think step by step, show the reasoning, and then
write the final answer on its own line.
In the morning the market opens early. People buy apples, bread, coffee, eggs, fish, milk, rice and
tea. A farmer sells vegetables from a small cart, and children walk to school along the river.
The weather is warm in summer and cold in winter; spring brings rain and autumn brings wind.
Write a function that returns the sum of a list of numbers. Then write a test that checks the
function with an empty list, a list with one number, and a list with many numbers.
The user asks a question and the assistant answers it politely. If the question is unclear, the
assistant asks for more details before giving an answer. Please be helpful, honest and precise.
Scientists observe nature carefully, measure temperature, pressure and velocity, and record every
experiment in a notebook. A hypothesis must be tested; evidence either supports it or refutes it.
Chemistry studies atoms, molecules and reactions, while biology describes cells, genes, proteins,
plants and animals. Physics explains gravity, energy, light, electricity and magnetism.
Astronomers watch distant galaxies, planets, comets and stars through powerful telescopes at night.
To bake a simple cake, combine flour, sugar, butter, salt and three eggs in a large bowl. Stir the
mixture gently, pour it into a greased pan, and bake it in a hot oven for about forty minutes. Let
the cake cool before slicing it. Serve it with fresh strawberries, cream or chocolate sauce.
Travellers often carry a passport, a map, a camera, comfortable shoes and a warm jacket. They visit
museums, castles, cathedrals, bridges, harbours, mountains, lakes, islands, deserts and forests.
Trains, buses, ferries, bicycles and airplanes connect cities, villages and countries around the world.
History teaches us about ancient empires, kingdoms, revolutions, inventions and discoveries.
Writers, painters, musicians and philosophers shaped culture with novels, poems, symphonies, songs,
sculptures and paintings. Libraries preserve manuscripts, newspapers, letters and photographs.
Athletes train daily: they run, jump, swim, climb, throw, lift, stretch and rest. Football,
basketball, tennis, cricket, hockey, rugby, baseball and volleyball are popular sports.
Computers process information using memory, storage, processors, networks, keyboards and screens.
Programmers design algorithms, debug errors, optimize performance, document interfaces, review code,
write tests, deploy servers, monitor logs and maintain databases. A compiler translates source code
into machine instructions; an interpreter executes statements directly.
Mathematics includes arithmetic, algebra, geometry, probability, statistics and calculus. A triangle
has three sides, a square has four equal sides, and a circle has a radius, a diameter and an area.
Fractions, decimals, percentages, equations, variables, functions, vectors and matrices appear often.
The doctor examined the patient, listened to her heartbeat, and prescribed medicine for the fever.
Nurses, teachers, engineers, lawyers, pilots, firefighters, carpenters, plumbers, electricians,
journalists, accountants, librarians and gardeners provide important services to the community.
Animals include dogs, cats, horses, cows, sheep, goats, rabbits, wolves, foxes, bears, lions, tigers,
elephants, giraffes, zebras, monkeys, dolphins, whales, sharks, eagles, owls, parrots and penguins.
Colors such as red, orange, yellow, green, blue, purple, pink, brown, black, white and grey describe
objects. Shapes can be round, square, flat, curved, narrow, wide, thick, thin, heavy or light.
Yesterday we walked quickly, talked quietly, laughed loudly, worked patiently and slept peacefully.
Tomorrow they will arrive, unpack, explore, negotiate, decide, celebrate, remember and return home.
Although the problem seemed difficult, the students discussed several strategies, compared results,
corrected mistakes and finally agreed on a solution. Collaboration, communication, curiosity and
persistence are valuable qualities. Therefore, whenever possible, share knowledge generously.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday make a week. January, February,
March, April, May, June, July, August, September, October, November and December make a year.
The old lighthouse keeper climbed the spiral staircase every evening, polished the enormous lens, and
watched fishing boats return through fog, thunderstorms and moonlight. His neighbour, a retired
sailor, repaired nets, carved wooden figures, and told exciting stories about whales, pirates,
shipwrecks and treasure hidden beneath coral reefs.
Economists analyse markets, prices, wages, taxes, inflation, unemployment, investment and trade.
Governments publish budgets, regulations and policies; citizens vote in elections, pay taxes, and
volunteer for charities. Universities organise lectures, seminars, laboratories and examinations.
Gardening requires patience: prepare the soil, sow seeds, water seedlings, remove weeds, prune
branches, harvest tomatoes, potatoes, carrots, onions, lettuce, cabbage, peppers and cucumbers.
Musicians practise scales, rhythms and melodies on pianos, violins, guitars, trumpets, flutes and drums.
An orchestra rehearses for weeks before performing a concert in a crowded auditorium.
Engineers calculate loads, test materials such as steel, concrete, glass, copper, aluminium and
plastic, and build bridges, tunnels, towers, dams, highways, railways, turbines and satellites.
Please summarise the following paragraph, translate the sentence into French, classify the review as
positive or negative, extract every date, and format the result as a numbered list.
Frequently, surprisingly, unfortunately, immediately, certainly, probably, usually and rarely are adverbs.
Happiness, kindness, darkness, freedom, wisdom, friendship, leadership, knowledge, courage, honesty,
justice, beauty, silence, patience and gratitude are abstract nouns.
"""

CODE = """\
def add(a, b):
    return a + b

def total(values):
    result = 0
    for value in values:
        result += value
    return result

class Counter:
    def __init__(self):
        self.count = 0

    def step(self, amount=1):
        self.count += amount
        return self.count

if __name__ == "__main__":
    import sys
    numbers = [int(x) for x in sys.argv[1:]]
    print(f"sum={total(numbers)}", {"n": len(numbers)}, sorted(numbers), max(numbers, default=None))
    assert add(2, 3) == 5 and total([1, 2, 3, 4]) == 10
"""

NAMES = ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Ivy", "Jack", "Kate", "Liam"]
THINGS = ["apples", "books", "coins", "pencils", "marbles", "cookies", "stamps", "shells", "cards",
          "flowers", "oranges", "stickers", "candles", "buttons", "tickets", "puzzles"]
VERBS = ["bought", "found", "collected", "painted", "baked", "borrowed", "sold", "packed", "counted",
         "planted", "cleaned", "repaired", "ordered", "wrapped", "delivered", "returned"]
PLACES = ["library", "garden", "kitchen", "station", "museum", "office", "school", "market", "harbour",
          "hospital", "bakery", "theatre", "stadium", "village", "factory", "warehouse"]
ADJECTIVES = ["bright", "quiet", "ancient", "modern", "gentle", "fierce", "tiny", "huge", "fragile", "sturdy",
              "curious", "clever", "careful", "brave", "honest", "elegant", "narrow", "spacious", "shiny", "dusty",
              "crowded", "peaceful", "noisy", "delicious", "bitter", "smooth", "rough", "frozen", "golden", "purple"]
UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
         "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    """Spell out 0 <= n < 1000 in English words."""
    if n >= 100:
        hundreds, rest = divmod(n, 100)
        return f"{UNITS[hundreds]} hundred" + ("" if rest == 0 else " and " + number_words(rest))
    if n < 20:
        return UNITS[n]
    tens, unit = divmod(n, 10)
    return TENS[tens] + ("" if unit == 0 else "-" + UNITS[unit])


def corpus_lines(im_start: str, im_end: str) -> list[str]:
    """Deterministic training text: prose, code, word problems, arithmetic and ChatML turns."""
    lines = PROSE.splitlines() + CODE.splitlines()
    combos = itertools.product(NAMES, VERBS, THINGS)
    for i, (name, verb, thing) in enumerate(itertools.islice(combos, 0, None, 7)):
        a, b = 3 + i % 17, 2 + (i * 7) % 13
        place = PLACES[i % len(PLACES)]
        lines.append(f"{name} {verb} {a} {thing} at the {place} and then {b} more. "
                     f"How many {thing} did {name} get in total? {a} + {b} = {a + b}. The answer is {a + b}.")
    for i, (adjective, place) in enumerate(itertools.product(ADJECTIVES, PLACES)):
        lines.append(f"The {adjective} {place} near {NAMES[i % len(NAMES)]}'s house was {ADJECTIVES[-1 - i % 30]} "
                     f"and full of {THINGS[i % len(THINGS)]}.")
    for a in range(0, 1000, 3):
        b = (a * 37 + 11) % 1000
        lines.append(f"{a} + {b} = {a + b}; {a} - {b} = {a - b}; {a % 50} * {b % 12} = {(a % 50) * (b % 12)}; "
                     f"{number_words(a)} plus {number_words(b)} equals {a + b}.")
    for i, line in enumerate(PROSE.splitlines()):
        lines.append(f"{im_start}user\nQuestion {i}: {line}{im_end}\n{im_start}assistant\n"
                     f"Let me think step by step. Answer: {number_words(i)}.{im_end}\n")
    return lines
