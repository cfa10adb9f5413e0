import sys, statistics as st
rows=[l.split() for l in open(sys.argv[1]) if len(l.split())==3]
names=[]
for r in rows:
    if r[1] not in names: names.append(r[1])
a=[float(r[2]) for r in rows if r[1]==names[0]]; b=[float(r[2]) for r in rows if r[1]==names[1]]
print(names[0], a); print(names[1], b)
print("medians %.3f %.3f ratio %.3f  B faster in %d of %d" % (st.median(a), st.median(b), st.median(b)/st.median(a), sum(y<x for x,y in zip(a,b)), len(b)))
